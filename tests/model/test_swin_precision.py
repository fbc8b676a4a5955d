"""bf16 and int8 inference of a Swin: what `set_precision` changes, and agreement with float32
on a small Swin over scikit-learn's 8x8 digits (upsampled to 16x16), as the ViT's precision
tests."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from _helpers import top1_agreement
from vitkit import SwinTransformer
from vitkit.model import precision
from vitkit.model.onednn_int8 import Int8Linear
from vitkit.model.precision import set_precision

TINY = dict(img_size=16, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depths=(2, 2),
            num_heads=(2, 4), window_size=4, drop_path_rate=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def digits():
    """(a random Swin with a fitted head, test images, labels): the head is fitted by ridge
    regression (lambda 0.1) on the random encoder's pooled features, so the logits are
    spread by the images, not near-ties of random weights, without a training loop (which
    the suite's CPU budget does not allow)."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 8 - 1  # (N, 1, 8, 8)
    x = nn.functional.interpolate(x, size=16, mode="nearest")  # (N, 1, 16, 16)
    y = torch.tensor(labels)
    torch.manual_seed(0)
    model = SwinTransformer(**TINY).eval()
    with torch.no_grad():
        feats = model.forward_head(model.forward_features(x[:1000]), pre_logits=True)
        feats = torch.cat([feats, torch.ones(len(feats), 1)], dim=1)  # (N, C + 1)
        targets = nn.functional.one_hot(y[:1000], 10).float() * 10  # (N, 10)
        gram = feats.T @ feats + 0.1 * len(feats) * torch.eye(feats.shape[1])
        solution = torch.linalg.solve(gram, feats.T @ targets)  # (C + 1, 10)
        model.head.fc.weight.copy_(solution[:-1].t())
        model.head.fc.bias.copy_(solution[-1])
    return model, x[1400:], y[1400:]


def _copy(model: SwinTransformer) -> SwinTransformer:
    twin = SwinTransformer(model.config)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def test_bf16_and_int8_agree_with_fp32(digits, monkeypatch):
    """bf16 weights (float32 images cast by the patch embedding) and int8 Linear layers of every
    stage and the head follow float32: top-1 agreement and every logit."""
    monkeypatch.setattr(precision, "native_bf16", lambda: True)  # the plain bf16 path anywhere
    reference, x, y = digits
    bf16, int8 = _copy(reference), _copy(reference)
    assert set_precision(bf16, "bf16") == "bf16" and set_precision(int8, "int8") == "int8"
    assert bf16.layers[1].blocks[1].attn.qkv.weight.dtype == torch.bfloat16

    def is_int8(m: nn.Module) -> bool:
        dynamic = type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")
        return isinstance(m, Int8Linear) or (type(m).__name__ == "Linear" and dynamic)

    quantised = [n for n, m in int8.named_modules() if is_int8(m)]
    assert len(quantised) == 4 * 4 + 1 + 1  # 4 per block, stage 1's patch merging, the head
    assert "layers.1.downsample.reduction" in quantised and "head.fc" in quantised
    with torch.inference_mode():
        want, got_bf16, got_int8 = reference(x), bf16(x), int8(x)
    assert (want.argmax(-1) == y).float().mean() > 0.15  # measured 0.20 (chance: 0.1)
    assert got_bf16.dtype == torch.bfloat16
    # measured 0.99 (bf16) and 0.97 (int8) top-1 agreement
    assert top1_agreement(want, got_bf16.float()) >= 0.93 and top1_agreement(want, got_int8) >= 0.93
    for got in (got_bf16.float(), got_int8):  # every logit, not only the top one
        assert (got - want).abs().max() < 0.15 * want.abs().max()
