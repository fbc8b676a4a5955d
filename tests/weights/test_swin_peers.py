"""The Swin beside transformers' and torchvision's own Swins, where they give more than
logits: the attention weights of every window (`return_attention`, HF's
`output_attentions=True`). Random weights far from any init, tiny configs; equal within 1e-5."""

from __future__ import annotations

import pytest
import torch
from _parity import images, randomize_far

from _helpers import optional_import, requires_transformers
from vitkit import load_pretrained

transformers = optional_import("transformers")
TOL = 1e-5


def _hf_model(version: int, **options) -> torch.nn.Module:
    """A two-stage HF `SwinModel` / `Swinv2Model` at 32 with patch 2 and windows of 4: stage
    maps 16 and 8, whole windows, every second block shifted."""
    config_cls = transformers.SwinConfig if version == 1 else transformers.Swinv2Config
    model_cls = transformers.SwinModel if version == 1 else transformers.Swinv2Model
    config = config_cls(**{**dict(embed_dim=16, depths=[2, 2], num_heads=[1, 2], image_size=32,
                                  patch_size=2, window_size=4), **options})  # fmt: skip
    return randomize_far(model_cls._from_config(config, attn_implementation="eager"))


def _hf_block_weights(hf: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every HF block's attention weights in order (HF returns the last block's per stage)."""
    found: list[torch.Tensor] = []
    hooks = [
        block.register_forward_hook(lambda _m, _i, out: found.append(out[1]))
        for stage in hf.encoder.layers
        for block in stage.blocks
    ]
    with torch.no_grad():
        hf(x, output_attentions=True)
    for hook in hooks:
        hook.remove()
    return found


@requires_transformers
@pytest.mark.parametrize("version", [1, 2])
def test_attention_weights_equal_transformers_output_attentions(version):
    hf = _hf_model(version)
    model = load_pretrained(hf.state_dict(), hf_config=hf.config)
    x = images(32, batch=2)
    with torch.no_grad():
        theirs = hf(x, output_attentions=True)
        features, attentions = model.forward_features(x, return_attention=True)
        logits, again = model(x, return_attention=True)
    assert [[tuple(w.shape) for w in stage] for stage in attentions] == [
        [(2 * 16, 1, 16, 16)] * 2,  # (B * nW, heads, N, N): 4x4 windows of a 16x16 map
        [(2 * 4, 2, 16, 16)] * 2,
    ]
    assert len(theirs.attentions) == 2  # the last block of each stage
    for ours, hf_weights in zip(attentions, theirs.attentions):
        torch.testing.assert_close(ours[-1], hf_weights, atol=TOL, rtol=TOL)
    every_block = [w for stage in attentions for w in stage]
    for ours, hf_weights in zip(every_block, _hf_block_weights(hf, x), strict=True):
        torch.testing.assert_close(ours, hf_weights, atol=TOL, rtol=TOL)
    hf_features = theirs.last_hidden_state.view(2, 8, 8, -1)  # (B, H/4, W/4, C)
    torch.testing.assert_close(features, hf_features, atol=TOL, rtol=TOL)
    torch.testing.assert_close(logits, model(x), atol=TOL, rtol=TOL)
    assert all(torch.equal(a, b) for s, t in zip(attentions, again) for a, b in zip(s, t))


@requires_transformers
def test_the_fused_path_stays_the_default_without_attention_weights(monkeypatch):
    """Version 1 calls SDPA once per block when no weights are asked, never when they are."""
    model = load_pretrained(_hf_model(1).state_dict(), hf_config=_hf_model(1).config)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    x = images(32)
    with torch.no_grad():
        plain = model(x)
        assert len(calls) == 4
        logits, _ = model(x, return_attention=True)
    assert len(calls) == 4
    torch.testing.assert_close(logits, plain, atol=TOL, rtol=TOL)
