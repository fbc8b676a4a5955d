"""The options later ViT families need: each against timm's model built from the same options
(timm's `VisionTransformer` run beside ours), and timm's parameter counts for the registered
family names. The CPU fast path over every option: tests/model/test_fast_paths.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitkit
from _helpers import randomize, requires_timm
from vitkit import convert
from vitkit.model.layers import QuickGELU, make_act
from vitkit.model.vit.presets import FAMILIES

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)

OPTIONS = [
    pytest.param(dict(reg_tokens=3), id="registers"),
    pytest.param(dict(reg_tokens=2, no_embed_class=True), id="no-embed-class"),
    pytest.param(dict(class_token=False, global_pool="avg"), id="no-cls"),
    pytest.param(dict(pre_norm=True, patch_bias=False, norm_eps=1e-5), id="norm-pre"),
    pytest.param(dict(final_norm=False), id="no-final-norm"),
    pytest.param(dict(global_pool="max"), id="max"),
    pytest.param(dict(global_pool="avgmax", fc_norm=False), id="avgmax"),
    pytest.param(dict(global_pool="map", class_token=False), id="map"),
    pytest.param(dict(global_pool="map", reg_tokens=1, pool_include_prefix=True), id="map+"),
    pytest.param(dict(pos_embed="none", class_token=False, global_pool="avg"), id="no-pos"),
    pytest.param(dict(proj_bias=False, qkv_bias=False), id="no-proj-bias"),
    pytest.param(dict(qk_norm=True), id="qk-norm"),
    pytest.param(dict(scale_attn_norm=True), id="attn-norm"),
    pytest.param(dict(scale_mlp_norm=True), id="mlp-norm"),
    pytest.param(dict(act_layer="gelu_tanh"), id="gelu-tanh"),
    pytest.param(dict(act_layer="quick_gelu"), id="quick-gelu"),
    pytest.param(dict(act_layer="silu"), id="silu"),
    pytest.param(dict(norm_layer="rmsnorm", norm_eps=1e-5), id="rmsnorm"),
    pytest.param(dict(mlp_layer="swiglu", act_layer="silu"), id="swiglu"),
    pytest.param(dict(mlp_layer="swiglu_packed", act_layer="silu"), id="glu"),
    pytest.param(dict(res_post_norm=True), id="res-post-norm"),
    pytest.param(dict(init_values=1e-2), id="layer-scale"),
]


def randomized(**options) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    return randomize(vitkit.VisionTransformer(**{**TINY, **options}))


def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@requires_timm
@pytest.mark.parametrize("options", OPTIONS)
def test_each_option_equals_timm(options):
    import timm

    model = randomized(**options)
    x = images()
    with torch.no_grad():
        ours = model(x)
    source = convert.source_model("timm", model.config, convert.to_timm(model))
    assert type(source) is timm.models.vision_transformer.VisionTransformer
    with torch.no_grad():  # measured at most 1.3e-7 on logits up to 1.1; tolerance 1e-5
        torch.testing.assert_close(ours, source(x), atol=1e-5, rtol=0)
    back, config = convert.from_timm(source.state_dict(), **_hidden(model.config))
    assert config == model.config.replace(init_values=config.init_values)


def _hidden(config: vitkit.ViTConfig) -> dict:
    """The options timm's weights do not record, as a caller states them."""
    size = dict(img_size=config.img_size) if config.pos_embed == "none" else {}
    return dict(
        **size,
        num_heads=config.num_heads,
        act_layer=config.act_layer,
        norm_eps=config.norm_eps,
        res_post_norm=config.res_post_norm,
        global_pool=config.global_pool,
        fc_norm=config.fc_norm,
        pool_include_prefix=config.pool_include_prefix,
    )


def test_activations_are_the_formulas():
    x = torch.linspace(-4, 4, 17)
    torch.testing.assert_close(make_act("quick_gelu")(x), x * torch.sigmoid(1.702 * x))
    tanh = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    torch.testing.assert_close(make_act("gelu_tanh")(x), tanh)
    torch.testing.assert_close(make_act("silu")(x), x * torch.sigmoid(x))
    assert isinstance(make_act("quick_gelu"), QuickGELU)


def test_swiglu_weights_and_widths():
    model = vitkit.VisionTransformer(**TINY, mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.0)
    mlp = model.blocks[0].mlp
    assert (mlp.fc1_g.out_features, mlp.fc1_x.out_features, mlp.fc2.in_features) == (128,) * 3
    x = torch.randn(2, 5, 64)
    expected = mlp.fc2(nn.functional.silu(mlp.fc1_g(x)) * mlp.fc1_x(x))
    torch.testing.assert_close(mlp(x), expected)
    packed = vitkit.VisionTransformer(**TINY, mlp_layer="swiglu_packed", mlp_ratio=2.0)
    mlp = packed.blocks[0].mlp
    assert (mlp.fc1.out_features, mlp.fc2.in_features) == (128, 64)
    gate, value = mlp.fc1(x).chunk(2, dim=-1)
    torch.testing.assert_close(mlp(x), mlp.fc2(nn.functional.gelu(gate) * value))


@requires_timm
def test_no_embed_class_positions_and_registers_at_another_size_equal_timm():
    import timm

    options = dict(reg_tokens=4, no_embed_class=True, dynamic_img_size=True, dynamic_img_pad=True)
    model = randomized(**options)
    assert model.pos_embed.shape == (1, 16, 64) and model.reg_token.shape == (1, 4, 64)
    assert model.num_prefix_tokens == 5
    source = convert.source_model("timm", model.config, convert.to_timm(model))
    assert isinstance(source, timm.models.vision_transformer.VisionTransformer)
    x = torch.randn(2, 3, 37, 45)  # padded to 40 x 48: a 5 x 6 grid, positions resampled
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), atol=1e-5, rtol=1e-5)
        assert model.forward_features(x).shape == (2, 5 + 30, 64)
    with pytest.raises(ValueError, match="^dynamic_img_pad=True needs dynamic_img_size=True$"):
        vitkit.VisionTransformer(**TINY, dynamic_img_pad=True)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(encoder="torch", qk_norm=True), r"^encoder='torch' .* cannot express qk_norm=True;"),
        (dict(distilled=True, reg_tokens=1), "^distilled=True takes no reg_tokens"),
        (dict(act_layer="relu"), "^unknown act_layer 'relu'; expected one of 'gelu', "),
        (dict(mlp_layer="swiglu_packed", mlp_ratio=1.5 + 1 / 64), "swiglu_packed' splits fc1"),
        (dict(global_pool="token", pool_include_prefix=True), "pool_include_prefix=True needs"),
        (dict(reg_tokens=-1), r"reg_tokens must be in \[0, 4096\]"),
    ],
)
def test_bad_family_options_are_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        vitkit.VisionTransformer(**{**TINY, **options})


def test_reset_classifier_get_classifier_and_head_size():
    model = randomized(global_pool="map", class_token=False)
    assert model.head_hidden_size == model.num_features == 64
    assert model.get_classifier() is model.head
    model.reset_classifier(3, global_pool="avg")
    assert model.attn_pool is None and model.config.global_pool == "avg"
    assert model.get_classifier().out_features == 3
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    with pytest.raises(ValueError, match="cannot add an attention pool"):
        model.reset_classifier(3, global_pool="map")
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        model.reset_classifier(3, global_pool="token")
    model.reset_classifier(0, global_pool="none")
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 16, 64)


# -- the registered timm names --------------------------------------------------------------

_NAMES = {name: family for family in FAMILIES for name in family.configs()}
# The names whose sizes are their family's own (the rest: the slow test).
_QUIRKY_SIZES = [
    "aimv2_1b_patch14_224",
    "beit3_giant_patch14_224",
    "vit_base_patch16_gap_224",
    "vit_giant_patch14_dinov2",
    "vit_giant_patch16_radio_v3",
    "vit_mediumd_patch16_reg4_gap_256",
    "vit_so150m2_patch16_reg1_gap_256",
    "vit_so400m_patch14_reg1_tipsv2",
    "vit_xsmall_patch16_clip_224",
]


def _same_as_timm(name: str) -> None:
    import timm

    config = vitkit.get_config(name)
    with torch.device("meta"):  # shapes only
        ours = vitkit.create_model(name)
        theirs = timm.create_model(name, pretrained=False, num_classes=config.num_classes)
        default = timm.create_model(name, pretrained=False)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert {k: v.shape for k, v in ours_sd.items()} == {k: v.shape for k, v in theirs_sd.items()}
    if name not in ("vit_large_patch32_224", "vit_huge_patch14_224"):  # the paper's presets
        assert config.num_classes == default.num_classes


@requires_timm
@pytest.mark.parametrize("name", _QUIRKY_SIZES)
def test_family_sizes_have_timms_parameters(name):
    _same_as_timm(name)


@pytest.mark.slow
@requires_timm
@pytest.mark.parametrize("name", sorted(_NAMES))
def test_every_family_name_has_timms_parameters(name):
    _same_as_timm(name)


@requires_timm
def test_intermediates_with_registers_and_norm_pre_equal_timms():
    import timm

    model = randomized(reg_tokens=2, pre_norm=True, patch_bias=False, norm_eps=1e-5)
    source = convert.source_model("timm", model.config, convert.to_timm(model))
    assert isinstance(source, timm.models.vision_transformer.VisionTransformer)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model.forward_intermediates(x, [0, 1], return_prefix_tokens=True, norm=True)
        theirs = source.forward_intermediates(x, [0, 1], return_prefix_tokens=True, norm=True)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-5)
    for (maps, prefix), (their_maps, their_prefix) in zip(ours[1], theirs[1]):
        assert prefix.shape == (2, 3, 64) and maps.shape == (2, 64, 4, 4)
        torch.testing.assert_close(maps, their_maps, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(prefix, their_prefix, atol=1e-5, rtol=1e-5)
