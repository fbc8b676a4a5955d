"""Attention maps on request: the same Attention modules, explicit softmax, same logits."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from vitkit import VisionTransformer

SIZES = [((32, 32), 8), ((60, 100), 20)]  # (img_size, patch): 1 + 16 and 1 + 15 tokens


def tiny(img_size, patch_size, **overrides) -> VisionTransformer:
    torch.manual_seed(0)
    options = dict(embed_dim=24, depth=3, num_heads=3, num_classes=7)
    options.update(overrides)
    return VisionTransformer(img_size=img_size, patch_size=patch_size, **options).eval()


def explicit_maps(model: VisionTransformer, x: Tensor) -> list[Tensor]:
    """softmax(q k^T * scale) per block, from the qkv weights by hand: (B, heads, N, N) each."""
    maps = []
    tokens = model.embed(x)  # (B, N, D)
    for block in model.blocks:
        attn = block.attn
        h = block.norm1(tokens)
        qkv = h @ attn.qkv.weight.T + attn.qkv.bias  # (B, N, 3D)
        batch, n, _ = qkv.shape
        q, k, _ = qkv.reshape(batch, n, 3, attn.num_heads, attn.head_dim).unbind(2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # each (B, heads, N, head_dim)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * attn.head_dim**-0.5
        maps.append(scores.softmax(dim=-1))
        tokens = block(tokens)
    return maps


@pytest.mark.parametrize("img_size,patch", SIZES)
def test_maps_shape_and_rows_sum_to_one(img_size, patch):
    model = tiny(img_size, patch)
    n = 1 + (img_size[0] // patch) * (img_size[1] // patch)
    with torch.no_grad():
        _, maps = model(torch.randn(2, 3, *img_size), return_attention=True)
    assert [m.shape for m in maps] == [(2, 3, n, n)] * 3
    for m in maps:
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 3, n), rtol=0, atol=1e-6)


@pytest.mark.parametrize("img_size,patch", SIZES)
def test_maps_equal_explicit_softmax(img_size, patch):
    model = tiny(img_size, patch)
    x = torch.randn(2, 3, *img_size)
    with torch.no_grad():
        _, maps = model.forward_features(x, return_attention=True)
        expected = explicit_maps(model, x)
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("img_size,patch", SIZES)
@pytest.mark.parametrize("overrides", [{}, dict(distilled=True), dict(global_pool="avg")])
def test_logits_identical_with_and_without_maps(img_size, patch, overrides):
    model = tiny(img_size, patch, **overrides)
    x = torch.randn(3, 3, *img_size)
    with torch.no_grad():
        plain = model(x)
        with_maps, _ = model(x, return_attention=True)
        feats, _ = model.forward_features(x, return_attention=True)
        plain_feats = model.forward_features(x)
    torch.testing.assert_close(with_maps, plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(feats, plain_feats, rtol=0, atol=1e-6)


def test_maps_follow_the_dynamic_input_size():
    model = tiny((60, 100), 20, dynamic_img_size=True)
    x = torch.randn(1, 3, 40, 120)  # grid 2x6 -> 13 tokens
    with torch.no_grad():
        logits, maps = model(x, return_attention=True)
        expected = explicit_maps(model, x)
        torch.testing.assert_close(logits, model(x), rtol=0, atol=1e-6)
    assert maps[0].shape == (1, 3, 13, 13)
    torch.testing.assert_close(maps[-1], expected[-1], rtol=0, atol=1e-6)


def test_maps_come_from_the_models_own_attention_modules(monkeypatch):
    """The default path runs each block's Attention (a forward hook sees it); the maps come from
    forward_with_weights on those same module objects, not copies."""
    model = tiny((60, 100), 20)
    x = torch.randn(1, 3, 60, 100)
    hooked, weighted = [], []
    for block in model.blocks:
        block.attn.register_forward_hook(lambda module, inputs, output: hooked.append(module))
        original = block.attn.forward_with_weights

        def recording(h, _module=block.attn, _original=original):
            out, weights = _original(h)
            weighted.append((_module, weights))
            return out, weights

        monkeypatch.setattr(block.attn, "forward_with_weights", recording)
    with torch.no_grad():
        model(x)
        assert hooked == [block.attn for block in model.blocks]
        _, maps = model(x, return_attention=True)
    assert [module for module, _ in weighted] == [block.attn for block in model.blocks]
    assert all(m is w for m, (_, w) in zip(maps, weighted))


def test_maps_track_the_modules_weights():
    """Editing a block's qkv weights in place changes the returned maps accordingly."""
    model = tiny((32, 32), 8)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model.blocks[1].attn.qkv.weight[:24].zero_()  # q = bias only
        model.blocks[1].attn.qkv.bias[:24].zero_()  # q = 0 -> uniform attention
        _, maps = model(x, return_attention=True)
    torch.testing.assert_close(maps[1], torch.full_like(maps[1], 1 / 17), rtol=0, atol=1e-7)


def test_torch_encoder_refuses_maps():
    model = tiny((32, 32), 8, encoder="torch")
    with pytest.raises(ValueError, match=r"return_attention=True needs encoder='native'"):
        model(torch.randn(1, 3, 32, 32), return_attention=True)
