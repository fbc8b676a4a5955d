"""Position-embedding tables against their formulas, and the resampler."""

import math

import pytest
import torch
import torch.nn.functional as F

from vitkit import VisionTransformer
from vitkit.model.layers.pos_embed import (
    fixed_pos_embed,
    resample_pos_embed,
    sincos_2d,
    sinusoid_1d,
)


def test_sinusoid_table_matches_vaswani_formula():
    table = sinusoid_1d(50, 16)
    assert table.shape == (50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sincos_2d_table_matches_big_vision_formula():
    h, w, dim = 3, 5, 16
    table = sincos_2d((h, w), dim)
    assert table.shape == (h * w, dim)
    quarter = dim // 4
    for y in range(h):
        for x in range(w):
            row = table[y * w + x]
            for k in range(quarter):
                omega = 1 / 10000 ** (k / (quarter - 1))
                expected = [
                    math.sin(x * omega),
                    math.cos(x * omega),
                    math.sin(y * omega),
                    math.cos(y * omega),
                ]
                got = [row[j * quarter + k].item() for j in range(4)]
                assert got == pytest.approx(expected, abs=1e-6)


def test_fixed_tables_have_prefix_rows():
    sincos = fixed_pos_embed("sincos2d", (2, 2), 8, num_prefix_tokens=1)
    assert sincos.shape == (1, 5, 8)
    assert torch.all(sincos[0, 0] == 0)
    sinus = fixed_pos_embed("sinusoid", (2, 2), 8, num_prefix_tokens=1)
    torch.testing.assert_close(sinus[0], sinusoid_1d(5, 8))


@pytest.mark.parametrize("kind", ["sinusoid", "sincos2d"])
def test_fixed_tables_are_buffers_not_parameters(kind):
    model = VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3, pos_embed=kind
    )
    assert "pos_embed" not in dict(model.named_parameters())
    assert "pos_embed" not in model.state_dict()
    assert "pos_embed" in dict(model.named_buffers())
    assert model.pos_embed.requires_grad is False


def test_odd_dims_are_refused():
    with pytest.raises(ValueError, match="pos_embed='sincos2d' needs embed_dim divisible by 4"):
        sincos_2d((2, 2), 18)
    with pytest.raises(ValueError, match="pos_embed='sinusoid' needs an even embed_dim"):
        sinusoid_1d(4, 7)


def test_resample_keeps_prefix_and_interpolates_grid_bicubic():
    torch.manual_seed(0)
    pos = torch.randn(1, 1 + 4 * 6, 8)
    out = resample_pos_embed(pos, new_size=(8, 3), old_size=(4, 6), num_prefix_tokens=1)
    assert out.shape == (1, 1 + 24, 8)
    assert torch.equal(out[:, :1], pos[:, :1])
    grid = pos[:, 1:].reshape(1, 4, 6, 8).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(8, 3), mode="bicubic", antialias=True)
    torch.testing.assert_close(out[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 24, 8))


def test_resample_same_size_is_identity_and_bad_grid_is_named():
    pos = torch.randn(1, 17, 4)
    assert resample_pos_embed(pos, (4, 4)) is pos
    with pytest.raises(ValueError, match="cannot infer the grid .* 17 patch positions"):
        resample_pos_embed(pos, (5, 5), num_prefix_tokens=0)
    with pytest.raises(ValueError, match="not 3x5"):
        resample_pos_embed(pos, (5, 5), old_size=(3, 5))
