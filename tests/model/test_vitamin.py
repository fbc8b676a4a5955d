"""timm's ViTamin (`vitamin.py`: an MbConv stem of MbConvLNBlock stages with LayerNorm2d, ViT
blocks with GeGLU MLPs normed at their input): every timm name is a vitkit name with timm's
parameters, and timm's weights load, from a state dict, a timm folder or under a name, with
timm's outputs."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import cli, convert
from vitkit.weights.vit.folders import save_timm_folder

timm = optional_import("timm")

# timm 1.0.31's parameter counts of the names as registered (heads of 768 to 1152 classes).
TIMM_PARAMS = {
    "vitamin_small_224": 22_173_376,
    "vitamin_base_224": 87_722_624,
    "vitamin_large_224": 333_318_816,
    "vitamin_large2_384": 333_970_336,
    "vitamin_xlarge_256": 436_055_232,
}


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).norm() / theirs.norm()).item()


def _timm_vitamin(name: str, **options) -> torch.nn.Module:
    """timm's model at 2 blocks, every weight perturbed (no unit norm or zero bias hides a
    mistake)."""
    torch.manual_seed(0)
    return randomize(timm.create_model(name, depth=2, **options))


def _image(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


@requires_timm
def test_every_timm_name_is_a_vitkit_name():
    assert vitkit.list_models("vitamin*") == timm.list_models("vitamin*")  # 13 in timm 1.0.31


@requires_timm
@pytest.mark.parametrize("name", vitkit.list_models("vitamin*"))
def test_parameter_counts_and_keys_equal_timm(name):
    with torch.device("meta"):  # shapes only: the large ones allocate nothing
        ours, theirs = vitkit.create_model(name), timm.create_model(name)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert count == TIMM_PARAMS.get(name, count)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    assert all(ours_sd[k].shape == theirs_sd[k].shape for k in ours_sd)


@requires_timm
@pytest.mark.parametrize("name", ["vitamin_small_224", "vitamin_large_224"])
def test_a_timm_state_dict_loads_without_a_name_with_timms_outputs(name):
    theirs = _timm_vitamin(name)
    state_dict = theirs.state_dict()
    assert convert.detect_format(state_dict) == "timm"  # not EVA's, whose keys w0 / w1 resemble
    ours = vitkit.load_pretrained(state_dict)
    assert ours.config == vitkit.get_config(name).replace(depth=2)  # every option from the keys
    x = _image(224)
    with torch.no_grad():  # measured 2e-7 (small) on random weights
        assert _relative_error(ours(x), theirs(x)) < 1e-4


@requires_timm
def test_a_timm_folder_loads_and_converts_back(tmp_path):
    theirs = _timm_vitamin("vitamin_base_224")
    timm.models.save_for_hf(theirs, tmp_path / "timm")  # config.json names the architecture
    ours = vitkit.load_pretrained(tmp_path / "timm")
    x = _image(224)
    with torch.no_grad():
        assert _relative_error(ours(x), theirs(x)) < 1e-4
    save_timm_folder(ours, tmp_path / "back")  # timm builds the stem in vitamin_base_224's factory
    again = timm.create_model(f"local-dir:{tmp_path / 'back'}", pretrained=True).eval()
    assert again.pretrained_cfg["first_conv"] == "patch_embed.backbone.stem.conv1"
    with torch.no_grad():
        torch.testing.assert_close(again(x), theirs(x), rtol=0, atol=0)


@requires_timm
def test_xlarge_weights_without_positions_take_the_size_of_their_name():
    theirs = _timm_vitamin("vitamin_xlarge_256")
    assert theirs.pos_embed is None
    ours = vitkit.load_pretrained(theirs.state_dict(), arch="vitamin_xlarge_256")
    assert ours.config.img_size == 256 and ours.pos_embed is None
    x = _image(256)
    with torch.no_grad():
        assert _relative_error(ours(x), theirs(x)) < 1e-4


@requires_timm
def test_other_sizes_and_intermediates_equal_timms():
    theirs = _timm_vitamin("vitamin_small_224", dynamic_img_size=True)
    ours = vitkit.load_pretrained(theirs.state_dict(), dynamic_img_size=True)
    x = torch.randn(1, 3, 256, 192, generator=torch.Generator().manual_seed(2))  # 16 x 12 tokens
    with torch.no_grad():
        assert _relative_error(ours(x), theirs(x)) < 1e-4
        maps = ours.forward_intermediates(x, indices=2, intermediates_only=True)
        timm_maps = theirs.forward_intermediates(x, indices=2, intermediates_only=True)
    assert [m.shape for m in maps] == [(1, 384, 16, 12)] * 2
    assert max(_relative_error(a, b) for a, b in zip(maps, timm_maps)) < 1e-4
    assert ours.feature_info[-1]["reduction"] == 16


def test_set_input_size_resamples_the_positions_only():
    model = vitkit.create_model("vitamin_small_224", depth=1)
    model.set_input_size(img_size=256)
    assert model.pos_embed.shape == (1, 256, 384)
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 256, 256)).shape == (1, 768)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(hybrid_widths=(8,)), "hybrid_widths needs hybrid='mbconv'"),
        (
            dict(hybrid="mbconv", hybrid_layers=(2, 4), hybrid_widths=(8,), patch_size=1),
            "hybrid='mbconv' needs blocks and channels per stage, got hybrid_layers=(2, 4), "
            "hybrid_widths=(8,); pass one width per stage (ViTamin-S: hybrid_layers=(2, 4), "
            "hybrid_widths=(64, 128))",
        ),
        (
            dict(hybrid="mbconv", hybrid_layers=(1,), hybrid_widths=(8,), patch_size=16),
            "hybrid='mbconv' ends in its own convolution to embed_dim, with no patch projection "
            "after it; pass patch_size=1, patch_embed='conv'",
        ),
        (
            dict(mlp_layer="geglu", scale_mlp_norm=True),
            "mlp_layer='geglu' norms its input, not its hidden layer; pass scale_mlp_norm=False",
        ),
    ],
)
def test_inconsistent_options_are_refused_with_the_fix(options, message):
    with pytest.raises(ValueError) as err:
        vitkit.ViTConfig(**options)
    assert str(err.value) == message


def test_the_flow_shows_the_stem_and_the_gated_mlp(capsys):
    assert cli.main(["summary", "vitamin_small_224", "--flow"]) == 0
    out = capsys.readouterr().out
    assert "conv stem: MbConvStem" in out and "flatten: flatten(2).transpose(1, 2)" in out
    assert "MLP input norm: LayerNorm" in out
    assert "MLP gate: Linear 384->768 + GELU" in out and "MLP output: Linear 768->384" in out
    assert "Total params: 22,173,376 (22.2M)" in out
