"""The Swin Transformer (V1 and V2) against timm's on timm's weights, and its window geometry.

timm's models are narrowed (width 32, two blocks per stage so every stage has a shifted block)
and perturbed: LayerNorm scales in [0.5, 1.5] (V2's res-post norms start at zero in timm),
logit scales in [0, 5] so that some pass V2's clamp at log 100. Outputs must equal timm's within
1e-5 relative (measured: below 1e-6).
"""

from __future__ import annotations

import math

import pytest
import torch

from _helpers import optional_import, perturb, relative_error, requires_timm
from vitkit import SwinConfig, SwinTransformer, create_model, get_config
from vitkit.model.swin.attention import LOGIT_SCALE_MAX, CosineWindowAttention
from vitkit.model.swin.window import (
    MASK_VALUE,
    relative_position_index,
    shift_mask,
    window_partition,
    window_reverse,
)

timm = optional_import("timm")
RTOL = 1e-5
NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))


def pair(name: str, timm_options: dict, ours: dict | None = None):
    """timm's `name` with `timm_options` (perturbed) and vitkit's `name` loading its state dict
    with strict=True (every key and shape)."""
    torch.manual_seed(0)
    source = perturb(timm.create_model(name, pretrained=False, **NARROW, **timm_options))
    model = create_model(name, **NARROW, **(ours if ours is not None else timm_options))
    model.load_state_dict(source.state_dict(), strict=True)
    return source, model.eval()


CASES = {
    # name: (timm options, vitkit options (None: the same), input size)
    "swin_tiny_patch4_window7_224": ({}, None, (224, 224)),
    "swin_base_patch4_window12_384": ({}, None, (384, 384)),
    "swinv2_tiny_window8_256": ({}, None, (256, 256)),
    "swinv2_small_window16_256": (  # the 12to16 names' pre-training windows
        dict(pretrained_window_sizes=(12, 12, 12, 6)),
        dict(pretrained_window_sizes=(12, 12, 12, 6)),
        (256, 256),
    ),
    "swin_s3_tiny_224": ({}, None, (224, 224)),  # a window per stage
}


@requires_timm
@pytest.mark.parametrize("name", list(CASES))
def test_outputs_equal_timms(name):
    timm_options, ours, size = CASES[name]
    source, model = pair(name, timm_options, ours)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs_features, ours_features = source.forward_features(x), model.forward_features(x)
        assert ours_features.shape == (2, size[0] // 32, size[1] // 32, 256)  # NHWC, as timm
        assert relative_error(ours_features, theirs_features) < RTOL
        assert relative_error(model(x), source(x)) < RTOL
        pooled = model.forward_head(ours_features, pre_logits=True)
        assert relative_error(pooled, source.forward_head(theirs_features, pre_logits=True)) < RTOL


@requires_timm
@pytest.mark.parametrize("name", ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"])
def test_other_input_sizes_equal_timms_with_dynamic_img_size(name):
    """Built at the preset's size, given 200x232: roll then pad to whole windows, masks built
    for the padded map, patch merging padding odd sides (50x58 -> 25x29 -> 13x15 -> 7x8)."""
    source, model = pair(name, dict(strict_img_size=False), dict(dynamic_img_size=True))
    x = torch.randn(2, 3, 200, 232, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert relative_error(model(x), source(x)) < RTOL
        assert model.forward_features(x).shape == (2, 7, 8, 256)


@requires_timm
def test_intermediates_and_reset_classifier_equal_timms():
    source, model = pair("swinv2_tiny_window8_256", {})
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, norm=True)
        their_final, their_maps = source.forward_intermediates(x, norm=True)
        assert relative_error(final, their_final) < RTOL
        assert [m.shape for m in maps] == [(1, 32, 64, 64), (1, 64, 32, 32), (1, 128, 16, 16),
                                           (1, 256, 8, 8)]  # fmt: skip
        for ours, theirs in zip(maps, their_maps):
            assert relative_error(ours, theirs) < RTOL
        assert len(model.forward_intermediates(x, [1], intermediates_only=True)) == 1
        for pool in ("max", "avgmax", ""):
            model.reset_classifier(0, pool)
            source.reset_classifier(0, pool)
            assert relative_error(model(x), source(x)) < RTOL
    model.reset_classifier(5, "avg")
    assert model(x).shape == (1, 5) and model.config.num_classes == 5
    assert model.get_classifier().out_features == 5


def test_windows_round_trip_and_offsets():
    x = torch.randn(2, 6, 8, 3)
    windows = window_partition(x, (3, 4))
    assert windows.shape == (2 * 2 * 2, 12, 3)
    torch.testing.assert_close(windows[1], x[0, 0:3, 4:8].reshape(12, 3))  # row-major windows
    torch.testing.assert_close(window_reverse(windows, (3, 4), 6, 8), x)
    index = relative_position_index((2, 3))
    assert index.shape == (6, 6) and index.max().item() == 3 * 5 - 1
    assert index[0, 0].item() == (2 - 1) * 5 + (3 - 1)  # offset (0, 0): the table's centre


def test_shift_mask_separates_the_rolled_regions():
    mask = shift_mask(8, 8, (4, 4), (2, 2))
    assert mask.shape == (4, 16, 16)
    assert set(mask.unique().tolist()) == {MASK_VALUE, 0.0}
    assert (mask[0] == 0).all()  # the top-left window holds one region only
    # the last window has four regions of 2x2 tokens: each token sees the 4 of its own
    assert ((mask[3] == 0).sum(dim=-1) == 4).all()


def test_a_window_no_smaller_than_the_map_is_clamped_and_not_shifted():
    model = SwinTransformer(SwinConfig(img_size=64, **NARROW))  # maps 16, 8, 4, 2
    blocks = [stage.blocks[1] for stage in model.layers]  # the shifted ones
    assert [b.window_size for b in blocks] == [(7, 7), (7, 7), (4, 4), (2, 2)]
    assert [b.shift_size for b in blocks] == [(3, 3), (3, 3), (0, 0), (0, 0)]
    assert blocks[2].attn_mask is None and blocks[0].attn_mask.shape == (9, 49, 49)
    always = SwinTransformer(SwinConfig(img_size=64, always_partition=True, **NARROW))
    assert always.layers[3].blocks[1].shift_size == (3, 3)


def test_v2_logit_scale_is_clamped_at_log_100():
    attention = CosineWindowAttention(8, num_heads=2, window=(2, 2))
    x = torch.randn(3, 4, 8)
    with torch.no_grad():
        attention.logit_scale.fill_(LOGIT_SCALE_MAX)
        at_clamp = attention(x)
        attention.logit_scale.fill_(10.0)
        torch.testing.assert_close(attention(x), at_clamp)
        attention.logit_scale.fill_(math.log(10.0))
        assert not torch.allclose(attention(x), at_clamp)


def test_config_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"num_heads \(3, 6\) has 2 entries for 4 stages"):
        SwinConfig(num_heads=(3, 6))
    with pytest.raises(ValueError, match="stage 1 is 192 wide, not divisible by its 5 heads"):
        SwinConfig(num_heads=(3, 5, 12, 24))
    with pytest.raises(ValueError, match=r"window_size \(7, 7\) has 2 entries for 4 stages"):
        SwinConfig(window_size=(7, 7))
    with pytest.raises(ValueError, match="feature_cls='hook' is not available for a Swin"):
        create_model("swin_tiny_patch4_window7_224", features_only=True, feature_cls="hook")


def test_v2_blocks_start_as_the_identity_and_v1_tables_are_initialised():
    model = create_model("swinv2_tiny_window8_256", **NARROW, img_size=64).eval()
    x = torch.randn(1, 3, 64, 64)
    stage = model.layers[0]
    with torch.no_grad():
        embedded = model.embed(x)
        torch.testing.assert_close(stage(embedded), embedded)  # zero res-post norms
    v1 = create_model("swin_tiny_patch4_window7_224", **NARROW)
    table = v1.layers[0].blocks[0].attn.relative_position_bias_table
    assert 0.01 < table.std().item() < 0.03
    assert get_config("swin_s3_small_224").windows == (14, 14, 14, 7)


@requires_timm
@pytest.mark.parametrize("old, new", [(7, 4), (7, 2), (7, 12), (12, 7), (8, 16)])
def test_bias_tables_resize_as_timms(old, new):
    from timm.layers import resize_rel_pos_bias_table as timm_resize

    from vitkit.model.swin.window import resize_rel_pos_bias_table

    table = torch.randn((2 * old - 1) ** 2, 3, generator=torch.Generator().manual_seed(old))
    theirs = timm_resize(table, new_window_size=(new, new), new_bias_shape=((2 * new - 1) ** 2, 3))
    torch.testing.assert_close(resize_rel_pos_bias_table(table, (new, new)), theirs)


@requires_timm
def test_parameter_groups_and_weight_decay_names_are_timms():
    from timm.models._manipulate import group_parameters

    for name in ("swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"):
        source, model = pair(name, {})
        for coarse in (False, True):  # the same groups (timm's V2 lists attn before norm1)
            ours = group_parameters(model, model.group_matcher(coarse))
            theirs = group_parameters(source, source.group_matcher(coarse))
            assert {k: sorted(v) for k, v in ours.items()} == {
                k: sorted(v) for k, v in theirs.items()
            }
        assert model.no_weight_decay() == source.no_weight_decay()


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = create_model("swinv2_tiny_window8_256", **NARROW, img_size=64, drop_path_rate=0.0)
    x = torch.randn(2, 3, 64, 64)
    model(x).square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).square().mean().backward()
    for grad, param in zip(plain, model.parameters()):
        torch.testing.assert_close(param.grad, grad)


@requires_timm
@pytest.mark.parametrize(
    "name, options",
    [
        ("swin_tiny_patch4_window7_224", dict(img_size=64, always_partition=True)),
        ("swinv2_tiny_window8_256", dict(img_size=(72, 40), always_partition=True)),
        ("swinv2_tiny_window8_256", dict(img_size=(72, 40))),  # windows clamped per side
    ],
)
def test_always_partition_and_non_square_maps_equal_timms(name, options):
    """Windows larger than the map: padded and shifted anyway (always_partition), or clamped
    per side (18x10 -> a 8x8 window, then 9x5 -> 8x5, ...)."""
    source, model = pair(name, options)
    x = torch.randn(2, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert relative_error(model(x), source(x)) < RTOL
