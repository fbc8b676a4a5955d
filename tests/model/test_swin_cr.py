"""timm's Swin V2-cr (`swinv2_cr_*`) against timm's on timm's weights, and its own geometry.

timm's models are narrowed (width 32, two blocks per stage so every stage has a shifted block)
and perturbed: LayerNorm scales in [0.5, 1.5] (the res-post norms start at zero in timm), logit
scales in [0, 5] so that some pass the clamp at log 100. Outputs must equal timm's within 1e-5
relative (measured: 0, the same operations in the same order).
"""

from __future__ import annotations

import math

import pytest
import torch

from _helpers import optional_import, perturb, relative_error, requires_timm
from vitkit import create_model
from vitkit.model import SwinCrConfig, SwinTransformerV2Cr
from vitkit.model.swin.attention import LOGIT_SCALE_MAX
from vitkit.model.swin.cr import log_relative_coords

timm = optional_import("timm")
RTOL = 1e-5
NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))


def pair(name: str, **options):
    """timm's `name` (perturbed) and vitkit's loading its state dict with strict=True."""
    options = {**NARROW, **options}
    timm_options = dict(options)
    if timm_options.pop("dynamic_img_size", False):
        timm_options["strict_img_size"] = False
    torch.manual_seed(0)
    source = perturb(timm.create_model(name, pretrained=False, **timm_options))
    model = create_model(name, **options)
    model.load_state_dict(source.state_dict(), strict=True)
    return source, model.eval()


CASES = {
    # id: (name, options, input size); maps 16, 8, 4, 2 at 64 (windows 2: the last clamped)
    "ns": ("swinv2_cr_small_ns_256", dict(img_size=64), (64, 64)),  # a norm3 per stage end
    "period": ("swinv2_cr_giant_224", dict(depths=(1, 1, 7, 1), img_size=64), (64, 64)),
    "non-square": ("swinv2_cr_tiny_224", dict(img_size=(64, 96)), (64, 96)),  # windows 2 x 3
    # maps 14 x 22, 7 x 11 (padded to whole windows), 4 x 6, 2 x 3
    "dynamic": ("swinv2_cr_tiny_384", dict(img_size=64, dynamic_img_size=True), (56, 88)),
    "always": ("swinv2_cr_base_224", dict(img_size=64, always_partition=True), (64, 64)),
    # maps 24, 12, 6, 3: the last padded to 4 and shifted
    "window": ("swinv2_cr_large_384", dict(img_size=96, window_size=(3, 3, 2, 2)), (96, 96)),
}


@requires_timm
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_timms(case):
    name, options, size = CASES[case]
    source, model = pair(name, **options)
    assert isinstance(model, SwinTransformerV2Cr)
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        their_final, their_maps = source.forward_intermediates(x)
        assert final.shape == (1, 256, -(-size[0] // 32), -(-size[1] // 32))  # NCHW, as timm
        assert relative_error(final, their_final) < RTOL and len(maps) == 4
        for ours, theirs in zip(maps, their_maps, strict=True):
            assert relative_error(ours, theirs) < RTOL
        assert relative_error(model.forward_head(final), source.forward_head(their_final)) < RTOL
    if case == "ns":  # forward and forward_features are the same path, once
        with torch.no_grad():
            assert torch.equal(model.forward_features(x), final)
            assert relative_error(model(x), source(x)) < RTOL


@requires_timm
def test_intermediates_heads_and_groups_equal_timms():
    source, model = pair("swinv2_cr_tiny_224", img_size=64)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.forward_intermediates(x, [1, 2], norm=True, stop_early=True,
                                           intermediates_only=True)  # fmt: skip
        theirs = source.forward_intermediates(x, [1, 2], stop_early=True, intermediates_only=True)
        assert [m.shape for m in ours] == [(1, 64, 8, 8), (1, 128, 4, 4)]
        assert all(relative_error(a, b) < RTOL for a, b in zip(ours, theirs))
        nhwc = model.forward_intermediates(x, [0], output_fmt="NHWC", intermediates_only=True)
        assert nhwc[0].shape == (1, 16, 16, 32)
        for pool in ("avgmax", ""):
            model.reset_classifier(0, pool)
            source.reset_classifier(0, pool)
            assert relative_error(model(x), source(x)) < RTOL  # '': the NCHW map, as timm
    assert model.group_matcher() == source.group_matcher()
    assert model.group_matcher(coarse=True) == source.group_matcher(coarse=True)
    assert model.feature_info == source.feature_info
    model.reset_classifier(5, "avg")
    assert model(x).shape == (1, 5) and model.config.num_classes == 5


def test_windows_follow_the_grid_and_extra_norms_the_config():
    assert SwinCrConfig(img_size=224).stage_windows == ((7, 7),) * 4
    assert SwinCrConfig(img_size=384).stage_windows == ((12, 12),) * 4
    assert SwinCrConfig(img_size=(64, 96)).stage_windows == ((2, 3),) * 4
    assert SwinCrConfig(img_size=64, window_ratio=(8, 8, 16, 64)).stage_windows == (
        (2, 2), (2, 2), (1, 1), (1, 1))  # fmt: skip
    assert SwinCrConfig(img_size=64, window_size=(5, 4, 3, 2)).stage_windows[0] == (5, 5)
    huge = SwinCrConfig(depths=(2, 2, 18, 2), extra_norm_period=6)
    placed = [(s, b) for s in range(4) for b in range(huge.depths[s]) if huge.extra_norm(s, b)]
    assert placed == [(2, 5), (2, 11), (2, 17), (3, 1)]  # every 6th, and the last stage's end
    ns = SwinCrConfig(extra_norm_stage=True)
    assert [b for s in range(4) for b in range(ns.depths[s]) if ns.extra_norm(s, b)] == [1, 1, 5, 1]
    with pytest.raises(ValueError, match="leave pretrained_window_sizes at 0 and qkv_bias at True"):
        SwinCrConfig(qkv_bias=False)
    with pytest.raises(ValueError, match="window_ratio .* give one per stage"):
        SwinCrConfig(window_ratio=(8, 8))


def test_position_bias_logit_scale_and_init():
    coords = log_relative_coords((2, 3))  # 6 tokens: (36, 2) offsets
    assert coords.shape == (36, 2)
    assert torch.allclose(coords[5], torch.tensor([-math.log(2.0), -math.log(3.0)]))  # (0,0)-(1,2)
    model = create_model("swinv2_cr_tiny_224", **NARROW, img_size=64)
    block = model.stages[0].blocks[1]
    assert block.window_size == (2, 2) and block.shift_size == (1, 1)
    assert model.stages[3].blocks[1].shift_size == (0, 0)  # the 2x2 map: clamped, not shifted
    assert (block.norm1.weight == 0).all() and (block.norm2.weight == 0).all()  # init_values 0
    assert isinstance(model.stages[2].blocks[1].norm3, torch.nn.Identity)
    assert isinstance(model.stages[3].blocks[1].norm3, torch.nn.LayerNorm)  # no final norm
    ones = create_model("swinv2_cr_tiny_224", **NARROW, img_size=64, init_values=None)
    assert (ones.stages[0].blocks[0].norm1.weight == 1).all()
    attn = block.attn
    assert attn.meta_mlp.drop1.p == 0.125 and attn.logit_scale.shape == (1,)
    with torch.no_grad():
        attn.logit_scale.fill_(10.0)
    q = k = torch.nn.functional.normalize(torch.randn(1, 1, 4, 32), dim=-1)
    assert torch.allclose(attn.logits(q, k).diagonal(dim1=-2, dim2=-1),
                          torch.full((1, 1, 4), math.exp(LOGIT_SCALE_MAX)))  # fmt: skip


@requires_timm
def test_set_input_size_equals_timms():
    """Another (non-square) size with the windows from the grid, then given windows, ratios and
    always_partition: timm's windows, shifts and masks; the parameters are the same objects."""
    source, model = pair("swinv2_cr_tiny_224", img_size=64)
    params = list(model.parameters())
    steps = [
        (dict(img_size=(96, 64)), (96, 64), (3, 2)),  # windows follow the grid (24, 16) / 8
        (dict(img_size=64, window_size=(4, 3, 2, 2)), (64, 64), (4, 4)),
        (dict(window_ratio=(4, 8, 8, 16), always_partition=True), (64, 64), (4, 4)),
    ]
    for options, size, window in steps:
        source.set_input_size(**options)
        model.set_input_size(**options)
        assert model.stages[0].blocks[1].window_size == window
        assert model.patch_embed.img_size == size
        assert model.config.grid_size == (size[0] // 4, size[1] // 4)  # the config follows
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            assert relative_error(model(x), source(x)) < RTOL
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    model.set_input_size(window_size=3)
    with pytest.raises(ValueError, match=r"has the windows 3; pass window_size= \(or window_ratio"):
        model.set_input_size(img_size=128)
