"""The paper's hybrid ViTs (Section 3.1) as timm builds them: a ResNetV2 (weight-standardised
convolutions, GroupNorm, 'SAME' padding) before the patch projection. Every timm hybrid name
has timm's parameters, and timm's weights load with timm's outputs."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import convert
from vitkit.model.layers.resnetv2 import StdConv2dSame, same_padding
from vitkit.model.vit.presets_hybrid import HYBRID_FAMILIES
from vitkit.weights.vit.folders import save_timm_folder

timm = optional_import("timm")

HYBRID_PATTERNS = ["vit_*_r50_*", "vit_*_r26_*", "vit_*_r_s16_*"]
# One name per family row, at depth 1 and a 64-pixel image (a 2 x 2 to 4 x 4 token grid).
REPRESENTATIVES = [min(family.configs()) for family in HYBRID_FAMILIES]


def _timm_hybrid(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)  # randomize perturbs the GroupNorms too: no unit norm hides a mistake
    return randomize(timm.create_model(name, depth=1, img_size=64, **options))


def _small_timm_hybrid(layers: tuple[int, ...], patch: int, **options) -> torch.nn.Module:
    """timm's hybrid ViT as its factories build it, with fewer ResNet stages (fast)."""
    from timm.layers import HybridEmbed
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_hybrid import _resnetv2

    torch.manual_seed(0)
    embed = partial(HybridEmbed, backbone=_resnetv2(layers=layers))
    model = VisionTransformer(img_size=64, patch_size=patch, embed_dim=32, depth=1, num_heads=4,
                              num_classes=5, embed_layer=embed, **options)  # fmt: skip
    return randomize(model)


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def test_same_padding_puts_the_odd_pixel_after_as_tensorflow():
    assert same_padding(224, 7, 2) == (2, 3)  # out 112: 111 * 2 + 7 - 224 = 5
    assert same_padding(225, 7, 2) == (3, 3)
    assert not StdConv2dSame(3, 8, 1, stride=2).same_pad  # a strided 1x1 needs none
    conv = StdConv2dSame(3, 8, 3, stride=2)
    assert conv(torch.randn(1, 3, 15, 16)).shape == (1, 8, 8, 8)  # ceil(side / 2)


def test_the_convolution_standardises_its_kernel():
    torch.manual_seed(0)
    conv = StdConv2dSame(4, 6, 3)
    x = torch.randn(2, 4, 9, 9)
    w = conv.weight
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
    expected = torch.nn.functional.conv2d(x, (w - mean) / (var + 1e-8).sqrt(), padding=1)
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        conv.weight.mul_(3.0).add_(1.0)  # scale and shift do not change the function
    torch.testing.assert_close(conv(x), expected, rtol=1e-4, atol=1e-4)


@requires_timm
def test_a_hybrid_name_has_timms_parameter_names_and_shapes():
    assert set(timm.list_models(HYBRID_PATTERNS)) <= set(vitkit.list_models())
    with torch.device("meta"):
        theirs = timm.create_model("vit_base_r50_s16_384").state_dict()
        ours = vitkit.create_model("vit_base_r50_s16_384").state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


@requires_timm
@pytest.mark.slow
def test_every_timm_hybrid_name_has_timms_parameter_names_and_shapes():
    names = timm.list_models(HYBRID_PATTERNS)
    assert len(names) == 9 and set(names) <= set(vitkit.list_models())
    for name in names:
        with torch.device("meta"):
            theirs = {k: v.shape for k, v in timm.create_model(name).state_dict().items()}
            ours = {k: v.shape for k, v in vitkit.create_model(name).state_dict().items()}
        assert ours == theirs, name


@requires_timm
@pytest.mark.parametrize("layers, patch", [((), 8), ((1, 1), 2)])
def test_timms_hybrid_weights_load_with_timms_outputs(layers, patch):
    source = _small_timm_hybrid(layers, patch)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    model = vitkit.load_pretrained(source.state_dict(), num_heads=4)  # read from the weights
    assert (model.config.hybrid, model.config.hybrid_layers) == ("resnetv2", layers)
    assert model.config.img_size == 64 and model.feature_info == source.feature_info
    with torch.no_grad():
        assert _relative_error(model(x), source(x)) < 1e-5


@requires_timm
@pytest.mark.slow
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_each_hybrid_family_loads_timms_weights_with_timms_outputs(name):
    source = _timm_hybrid(name)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = source(x)
        for model in (
            vitkit.load_pretrained(source.state_dict()),  # the backbone read from the weights
            vitkit.load_pretrained(source.state_dict(), arch=name),
        ):
            assert model.config.hybrid == "resnetv2" and model.config.img_size == 64
            assert _relative_error(model(x), expected) < 1e-5, name
    assert model.feature_info == source.feature_info
    _, config = convert.from_timm(source.state_dict())
    assert config.hybrid_layers == vitkit.create_model(name, depth=1).config.hybrid_layers


@requires_timm
def test_a_hybrid_timm_hub_folder_takes_other_sizes_and_converts_back(tmp_path):
    source = _timm_hybrid("vit_tiny_r_s16_p8_224", dynamic_img_size=True)  # the stem alone
    timm.models.save_for_hf(source, tmp_path)  # config.json names the architecture
    model = vitkit.load_pretrained(tmp_path)
    assert model.config.dynamic_img_size and model.config.patch_size == 8
    x = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(2))  # 3 x 4 tokens
    with torch.no_grad():
        assert _relative_error(model(x), source(x)) < 1e-5
    rebuilt = convert.source_model("timm", model.config, convert.to_timm(model))
    assert type(rebuilt.patch_embed).__name__ == "HybridEmbed"
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), source(x), rtol=0, atol=0)


@requires_timm
@pytest.mark.parametrize("name", ["vit_tiny_r_s16_p8_224", "vit_small_r26_s32_224"])
def test_a_hybrid_exports_as_a_timm_folder_of_its_cnns_name(tmp_path, name):
    """timm builds the ResNetV2 in the factory of a hybrid name, never from `model_args`
    (before, the folder's config.json could not be written)."""
    model = vitkit.load_pretrained(_timm_hybrid(name).state_dict(), arch=name, img_size=64)
    save_timm_folder(model, tmp_path)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    assert theirs.pretrained_cfg["first_conv"] == model.config.first_conv
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # measured 5.5e-7 and 8.7e-7: timm's kernels on the same weights
        assert _relative_error(model(x), theirs(x)) < 1e-5


@pytest.mark.parametrize(
    "name, reason",
    [
        ("vit_base_resnet50d_224", "a ResNet-D backbone"),
        ("vit_small_resnet26d_224", "a ResNet-D backbone"),
        ("vit_base_mci_224", "MobileCLIP's stem"),
    ],
)
def test_hybrids_over_other_cnns_are_refused_in_one_line(name, reason):
    with pytest.raises(ValueError, match=rf"^timm's {name} uses {reason}") as err:
        vitkit.create_model(name)
    assert "\n" not in str(err.value)


def test_a_timm_folder_of_a_refused_name_is_refused_by_its_architecture(tmp_path):
    """Before its weights are read (their keys alone looked like a plain ViT with extra
    layers)."""
    (tmp_path / "config.json").write_text('{"architecture": "vit_small_resnet26d_224"}')
    torch.save({"patch_embed.backbone.conv1.0.weight": torch.zeros(1)}, tmp_path / "w.pth")
    with pytest.raises(ValueError) as err:
        vitkit.load_pretrained(tmp_path)
    assert str(err.value) == (
        "timm's vit_small_resnet26d_224 uses a ResNet-D backbone (timm's resnet.py: BatchNorm, a "
        "deep stem, average-pool shortcuts), not the paper's ResNetV2 (vitkit's hybrids: "
        "vit_*_r50_*, vit_*_r26_*), which vitkit does not implement"
    )


def test_hybrid_options_are_checked():
    with pytest.raises(ValueError, match=r"^hybrid_layers needs hybrid='resnetv2' or 'mbconv'$"):
        vitkit.ViTConfig(hybrid_layers=(3, 4, 9))
    with pytest.raises(ValueError, match=r"^hybrid and conv_stem are two stems"):
        vitkit.ViTConfig(hybrid="resnetv2", conv_stem=(16,), patch_size=1)
    config = vitkit.ViTConfig(hybrid="resnetv2", hybrid_layers=(3, 4, 9), patch_size=1)
    assert config.grid_size == (14, 14) and config.family_options() == [
        "hybrid='resnetv2'",
        "hybrid_layers=(3, 4, 9)",
    ]
