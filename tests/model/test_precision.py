"""bf16 and int8 inference: what runs where, and how closely it agrees with float32.

The agreement tests use a small ViT trained for a few seconds on scikit-learn's 8x8 digits, so
top-1 agreement is measured on real decisions, not on the near-ties of random weights. The
fused bf16 kernels need a CPU with native bf16 (AVX-512 BF16 / AMX): those tests skip
elsewhere, and the fallback is tested everywhere.
"""

from __future__ import annotations

import logging

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from _helpers import randomize, top1_agreement
from vitkit import VisionTransformer
from vitkit.model import precision
from vitkit.model.onednn_int8 import Int8Linear, int8_unsupported_reason
from vitkit.model.precision import native_bf16, quantize_int8, set_precision
from vitkit.model.vit import onednn

needs_bf16 = pytest.mark.skipif(not native_bf16(), reason="no native bf16 on this CPU")


@pytest.fixture(scope="module")
def digits():
    """(model trained in float32, test images, test labels): 8x8 digits, 4x4 patches."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 8 - 1  # (N, 1, 8, 8)
    y = torch.tensor(labels)
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=10,
                              embed_dim=64, depth=2, num_heads=4)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_x, train_y = x[:1400], y[:1400]
    for step in range(200):
        batch = torch.randint(
            0, len(train_x), (128,), generator=torch.Generator().manual_seed(step)
        )
        loss = nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model, x[1400:], y[1400:]


def _copy(model: VisionTransformer) -> VisionTransformer:
    twin = VisionTransformer(model.config)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def test_trained_model_is_accurate(digits):
    """The fixture's model decides for real (else agreement would mean little)."""
    model, x, y = digits
    with torch.inference_mode():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    assert accuracy > 0.85


def test_unknown_precision_is_one_clear_error():
    with pytest.raises(
        ValueError, match="unknown precision 'fp16'; choose one of fp32, bf16, int8"
    ):
        set_precision(VisionTransformer(img_size=8, patch_size=4, embed_dim=32, depth=1,
                                        num_heads=2), "fp16")  # fmt: skip


def test_bf16_without_native_bf16_keeps_fp32_and_says_why(digits, monkeypatch, caplog):
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    model = _copy(digits[0])
    with caplog.at_level(logging.WARNING, logger="vitkit.model.precision"):
        assert set_precision(model, "bf16") == "fp32"
    assert "no native bf16" in caplog.text
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_model_takes_float32_images_and_agrees_with_fp32(digits, monkeypatch):
    """bf16 weights (the plain path where the CPU lacks the fused kernels): float32 input is
    cast by the patch embedding, and top-1 agrees with float32 on >= 99% of the digits."""
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    reference, x, _ = digits
    model = _copy(reference)
    assert set_precision(model, "bf16") == "bf16"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.inference_mode():
        want, got = reference(x), model(x)
    assert got.dtype == torch.bfloat16
    assert top1_agreement(want, got) >= 0.99
    # measured 0.047 on logits up to 9.6 (0.5%); tolerance 1.5% of the largest logit (3x)
    assert (got.float() - want).abs().max() < 0.015 * want.abs().max()


@needs_bf16
def test_fused_bf16_equals_plain_bf16(digits):
    """The fast path's bf16 kernels compute the plain bf16 path's function (bf16 rounding
    apart), and are taken."""
    model = _copy(digits[0]).to(torch.bfloat16)
    x = digits[1].to(torch.bfloat16)
    with torch.inference_mode():
        assert model.blocks[0].fast_path_blocker(model.embed(x)) == ""
        fused = model(x).float()
        model.set_fast_path(False)
        plain = model(x).float()
    # measured 0.0625 on logits up to 9.6 (0.65%): bf16 steps; tolerance 2% (3x)
    assert (fused - plain).abs().max() < 0.02 * plain.abs().max()
    assert top1_agreement(fused, plain) >= 0.99


@needs_bf16
def test_bf16_autocast_takes_the_fused_kernels(digits):
    """Under torch.autocast('cpu', torch.bfloat16) over float32 weights the fused blocks run
    bf16 kernels (weights packed in bf16 once) and agree with float32."""
    model = _copy(digits[0])
    x = digits[1]
    with torch.inference_mode():
        want = model(x)
        with torch.autocast("cpu", torch.bfloat16):
            assert model.blocks[0].fast_path_blocker(model.embed(x)) == ""
            got = model(x)
    assert top1_agreement(want, got.float()) >= 0.99
    assert torch.bfloat16 in onednn._PACKED[model.blocks[0].attn.qkv]


@pytest.mark.skipif(native_bf16(), reason="this CPU has native bf16")
def test_bf16_autocast_without_native_bf16_takes_the_plain_path(digits):
    model = _copy(digits[0])
    x = digits[1][:4]
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        reason = model.blocks[0].fast_path_blocker(model.embed(x))
        model(x)  # the plain path under autocast runs
    assert reason == "oneDNN has no fast torch.bfloat16 kernel on this CPU"


def test_other_autocast_dtypes_are_not_fused(digits):
    model = _copy(digits[0])
    x = digits[1][:4]
    with torch.inference_mode(), torch.autocast("cpu", torch.float16):
        reason = model.blocks[0].fast_path_blocker(model.embed(x))
    assert reason == (
        "autocast to torch.float16 over torch.float32 weights (only bf16 autocast over "
        "float32 weights is fused)"
    )


def test_int8_quantises_every_block_linear_and_the_head(digits):
    """`Int8Linear` (oneDNN's int8 kernels) for every Linear of the blocks and the head where
    torch has them; the blocks keep their class (the fused path takes int8 blocks), the patch
    embedding stays float."""
    model = _copy(digits[0])
    block_classes = [type(block) for block in model.blocks]
    assert set_precision(model, "int8") == "int8"
    assert [type(block) for block in model.blocks] == block_classes
    depth = len(model.blocks)
    expected = [f"blocks.{i}.{name}" for i in range(depth)
                for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")] + ["head"]  # fmt: skip
    int8 = [n for n, m in model.named_modules() if isinstance(m, Int8Linear)]
    dynamic = [n for n, m in model.named_modules() if type(m).__name__ == "Linear"
               and type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")]  # fmt: skip
    assert sorted(dynamic if int8_unsupported_reason() else int8) == sorted(expected)
    assert isinstance(model.patch_embed.proj, nn.Conv2d)  # pixels stay float
    if not int8_unsupported_reason():
        assert onednn.unfused_layer(model.blocks[0]) == ""


def test_int8_without_onednn_int8_kernels_keeps_quantize_dynamic(digits, monkeypatch):
    """A torch without oneDNN's int8 operators gets torch's dynamic quantisation, and the fused
    block then names the quantised layer it cannot fuse."""
    monkeypatch.setattr(precision, "int8_unsupported_reason", lambda: "torch lacks them")
    reference, x, _ = digits
    model = quantize_int8(_copy(reference))
    assert not any(isinstance(m, Int8Linear) for m in model.modules())
    assert type(model.blocks[0].attn.qkv).__module__.startswith("torch.ao.nn.quantized.dynamic")
    assert onednn.unfused_layer(model.blocks[0]) == (
        "attn.qkv is a torch.ao.nn.quantized.dynamic.modules.linear.Linear, not one the fused "
        "kernels implement (Linear, OneDNNLinear, Int8Linear)"
    )
    with torch.inference_mode():
        assert top1_agreement(reference(x), model(x)) >= 0.98


def test_int8_agrees_with_fp32(digits):
    """int8 dynamic quantisation: >= 98% top-1 agreement, accuracy within 2 points."""
    reference, x, y = digits
    model = quantize_int8(_copy(reference))
    with torch.inference_mode():
        want, got = reference(x), model(x)
    assert top1_agreement(want, got) >= 0.98
    # measured 0.29 on logits up to 9.6 (3%); tolerance 10% of the largest logit (3.4x)
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    accuracy = [(out.argmax(-1) == y).float().mean().item() for out in (want, got)]
    assert abs(accuracy[0] - accuracy[1]) <= 0.02


def test_int8_model_survives_switching_the_fast_path_on(digits):
    """A quantised model told to take the fast path stays on the plain one, with the reason."""
    reference, x, _ = digits
    model = quantize_int8(_copy(reference))
    with torch.inference_mode():
        before = model(x[:8])
        model.set_fast_path(True)
        after = model(x[:8])
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_int8_refuses_a_gpu_model(monkeypatch):
    model = VisionTransformer(img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2)
    monkeypatch.setattr(precision, "model_device", lambda m: torch.device("cuda"))
    with pytest.raises(ValueError, match="int8 .* runs on CPU only; the model is on cuda"):
        set_precision(model, "int8")


def test_weights_loaded_in_inference_mode_are_not_served_stale():
    """Weights made under torch.inference_mode() have no version counter: the fast path packs
    them per call, so a second load_state_dict there changes the output (it used to raise
    'Inference tensors do not track version counter')."""
    config = dict(img_size=32, patch_size=8, embed_dim=192, depth=1, num_heads=3)
    first, second = VisionTransformer(**config), VisionTransformer(**config)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        model = VisionTransformer(**config).eval()
        model.load_state_dict(first.state_dict())
        out_first = model(x)
        model.load_state_dict(second.state_dict())
        out_second = model(x)
        want = second.eval()(x)
    assert not torch.equal(out_first, out_second)
    torch.testing.assert_close(out_second, want, rtol=1e-5, atol=1e-5)


def test_int8_packs_for_onednn_and_restores_the_global_engine(digits):
    """The weights are packed for oneDNN's int8 kernels where torch has them; the process-wide
    quantized engine is left as it was."""
    before = torch.backends.quantized.engine
    model = quantize_int8(_copy(digits[0]))
    assert torch.backends.quantized.engine == before
    assert precision.INT8_ENGINE in torch.backends.quantized.supported_engines
    with torch.inference_mode():
        assert model(digits[1][:4]).shape == (4, 10)


def _random_with_layer_scale() -> tuple[VisionTransformer, torch.Tensor, torch.Tensor]:
    """A model on random weights (biases, norms, LayerScale all non-trivial), images and its
    float32 logits."""
    torch.manual_seed(0)
    model = randomize(VisionTransformer(img_size=16, patch_size=4, embed_dim=64, depth=2,
                                        num_heads=4, num_classes=10, init_values=0.1))  # fmt: skip
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return model, x, model(x)


def test_bf16_and_int8_follow_fp32_on_random_weights_with_layer_scale(monkeypatch):
    """Element-wise, not only top-1: every layer's bias, norm and scale is carried over."""
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    reference, x, want = _random_with_layer_scale()
    bf16, int8 = _copy(reference), _copy(reference)
    assert set_precision(bf16, "bf16") == "bf16" and set_precision(int8, "int8") == "int8"
    with torch.inference_mode():
        got_bf16, got_int8 = bf16(x).float(), int8(x)
    assert want.abs().max() > 0.5  # logits far from zero: an all-zero output fails
    # measured 6.2e-3 (bf16) and 2.0e-2 (int8) on logits up to 0.72; tolerances 3x those
    torch.testing.assert_close(got_bf16, want, atol=2e-2, rtol=0)
    torch.testing.assert_close(got_int8, want, atol=6e-2, rtol=0)
