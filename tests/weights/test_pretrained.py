"""`load_pretrained`: position-grid resampling, new heads, loading into a given model (as
`vitkit train --pretrained` does), and readable reports."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError, VisionTransformer


def test_resample_224_to_384_matches_timm():
    timm = pytest.importorskip("timm", reason="timm not installed")
    from timm.layers import resample_abs_pos_embed
    from timm.models.vision_transformer import checkpoint_filter_fn

    source = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    sd = source.state_dict()
    model = vitkit.load_pretrained(sd, img_size=384)
    expected = resample_abs_pos_embed(sd["pos_embed"], new_size=(24, 24), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, **TOL)
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)

    big = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=384).eval()
    big.load_state_dict(checkpoint_filter_fn(sd, big))
    x = images(384)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, 1000)
        torch.testing.assert_close(out, big(x), **TOL)


def test_new_num_classes_reinitialises_only_the_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    model = vitkit.load_pretrained(source.state_dict(), num_classes=7, num_heads=4)
    assert model.head.weight.shape == (7, 64)
    assert model.config.num_classes == 7
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            assert torch.equal(model.state_dict()[key], value), key


def test_load_into_given_model_with_other_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    target = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=3
    )
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    assert model is target and model.head.weight.shape == (3, 64)
    assert torch.equal(model.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)


def test_load_into_given_model_at_another_resolution():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4)
    )
    target = VisionTransformer(img_size=(48, 64), patch_size=8, embed_dim=64, depth=1, num_heads=4)
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    expected = vitkit.model.pos_embed.resample_pos_embed(source.pos_embed, new_size=(6, 8))
    assert torch.equal(model.pos_embed.detach(), expected.detach())
    assert model(images((48, 64))).shape == (1, 1000)
    with pytest.raises(ValueError, match=r"img_size= applies when load_pretrained builds"):
        vitkit.load_pretrained(source.state_dict(), model=target, img_size=64)


def test_load_into_wrong_model_gives_readable_report():
    source = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    target = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=4)
    with pytest.raises(CheckpointError, match=r"missing: blocks\.2\.attn\.proj\.bias"):
        vitkit.load_pretrained(source.state_dict(), model=target)
