"""timm's ViTamin (`vitamin.py`: an MbConv stem of MbConvLNBlock stages with LayerNorm2d, GeGLU
MLPs with an inner LayerNorm) is not built: each of its names is refused in one line with the
reason, wherever a name or its weights are given."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from _helpers import optional_import, requires_timm
from vitkit import cli
from vitkit.model.vit.presets import VITAMIN_NAMES

timm = optional_import("timm")

REASON = (
    "ViTamin's MbConv stem (timm's vitamin.py: MbConvLNBlock stages with LayerNorm2d, then a "
    "strided 3x3 convolution) and GeGLU MLPs with an inner LayerNorm"
)
KEYS_REFUSAL = (
    "the weights are timm's ViTamin (vitamin_*: keys patch_embed.backbone.stages.*.conv2_kxk.*), "
    f"which uses {REASON}, which vitkit does not implement"
)


def _name_refusal(name: str) -> str:
    return f"timm's {name} uses {REASON}, which vitkit does not implement"


def _cli_error(capsys, *argv) -> tuple[int, str]:
    """`vitkit ARGV`'s exit code and the last line it wrote to stderr."""
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err.splitlines()[-1]


@requires_timm
def test_the_names_are_timms():
    assert sorted(VITAMIN_NAMES) == timm.list_models("vitamin*")  # 13 in timm 1.0.31


@pytest.mark.parametrize("name", VITAMIN_NAMES)
def test_create_model_refuses_each_name_with_the_reason(name):
    with pytest.raises(ValueError) as err:
        vitkit.create_model(name)
    assert str(err.value) == _name_refusal(name)
    assert name not in vitkit.list_models()


def test_the_cli_refuses_the_name_given_to_model(capsys, tmp_path):
    found = _cli_error(capsys, "train", "--model", "vitamin_base_224", "--out", tmp_path / "run")
    assert found == (2, f"vitkit: error: {_name_refusal('vitamin_base_224')}")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def vitamin_weights(tmp_path_factory):
    """A one-block vitamin_small_224 of timm: its timm folder and its state dict alone."""
    torch.manual_seed(0)
    model = timm.create_model("vitamin_small_224", depth=1)
    root = tmp_path_factory.mktemp("vitamin")
    timm.models.save_for_hf(model, root / "folder")
    torch.save(model.state_dict(), root / "weights.pth")
    return root


@requires_timm
def test_a_timm_folder_of_vitamin_is_refused_by_its_architecture(vitamin_weights):
    assert json.loads((vitamin_weights / "folder" / "config.json").read_text())["architecture"] == (
        "vitamin_small_224"
    )
    with pytest.raises(ValueError) as err:
        vitkit.load_pretrained(vitamin_weights / "folder")
    assert str(err.value) == _name_refusal("vitamin_small_224")


@requires_timm
@pytest.mark.parametrize("options", [{}, {"format": "timm"}, {"arch": "vitamin_small_224"}])
def test_vitamin_weights_are_refused_by_their_keys(vitamin_weights, options):
    """Before, EVA's reader claimed them and asked for a name it then did not know."""
    with pytest.raises(vitkit.CheckpointError) as err:
        vitkit.load_pretrained(vitamin_weights / "weights.pth", **options)
    assert str(err.value) == KEYS_REFUSAL


@requires_timm
def test_a_vitamin_state_dict_is_refused_by_its_keys(vitamin_weights):
    state_dict = torch.load(vitamin_weights / "weights.pth", weights_only=True)
    assert "patch_embed.backbone.stages.0.0.conv2_kxk.weight" in state_dict  # timm's keys
    with pytest.raises(vitkit.CheckpointError) as err:
        vitkit.load_pretrained(state_dict)
    assert str(err.value) == KEYS_REFUSAL
    with pytest.raises(vitkit.CheckpointError) as err:
        vitkit.convert.detect_format(state_dict)
    assert str(err.value) == KEYS_REFUSAL


@requires_timm
@pytest.mark.parametrize("weights", ["folder", "weights.pth"])
def test_the_cli_refuses_vitamin_weights_given_to_pretrained(vitamin_weights, weights, capsys):
    argv = ["train", "--pretrained", vitamin_weights / weights, "--out", vitamin_weights / "run"]
    refusal = _name_refusal("vitamin_small_224") if weights == "folder" else KEYS_REFUSAL
    assert _cli_error(capsys, *argv) == (2, f"vitkit: error: {refusal}")
    assert not (vitamin_weights / "run").exists()
