"""Hugging Face DINOv3 (`DINOv3ViTModel`) read as timm's DINOv3 EVA (weights/eva/hf.py): a
folder `save_pretrained` wrote, and a state dict in transformers 5's module keys with its
config, give transformers' `last_hidden_state` and `pooler_output` within 1e-5 (plain and gated
MLP, with and without register tokens, a non-square input); what the EVA cannot hold is refused
in one line; a folder fine-tunes on the digits."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, relative_error
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.weights import inspect
from vitkit.weights.checkpoint import MissingOptionError

transformers = optional_import("transformers")
pytestmark = pytest.mark.requires("transformers", extra="interop")
RTOL = 1e-5


def _dinov3(**options) -> torch.nn.Module:
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "image_size": 32,
        "patch_size": 8,
        "num_register_tokens": 4,
        "layerscale_value": 0.5,
        **options,
    }
    torch.manual_seed(0)
    model = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.1)  # no zero bias or unit LayerScale hides a misplaced tensor
    return model


def _same_outputs(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(pixel_values=x)
        assert relative_error(ours.forward_features(x), expected.last_hidden_state) < RTOL
        assert relative_error(ours(x), expected.pooler_output) < RTOL


@pytest.mark.parametrize(
    "options",
    [{}, {"use_gated_mlp": True, "hidden_act": "silu", "num_register_tokens": 0}],
    ids=["mlp", "gated-mlp"],
)
def test_a_folder_loads_with_transformers_outputs(tmp_path, options):
    theirs = _dinov3(**options)
    theirs.save_pretrained(tmp_path)
    info = inspect(tmp_path)
    assert (info.format, info.config.rope_type, info.config.num_heads) == ("hf", "dinov3", 2)
    _same_outputs(load_pretrained(tmp_path), theirs)


def test_a_state_dict_of_transformers_modules_loads_with_its_config():
    theirs = _dinov3()
    state_dict = theirs.state_dict()
    assert "model.layer.0.layer_scale1.lambda1" in state_dict  # transformers 5's module keys
    ours = load_pretrained(state_dict, format="hf", hf_config=theirs.config)
    _same_outputs(ours, theirs)


def test_what_the_weights_and_the_eva_cannot_hold_is_refused_in_one_line(tmp_path):
    with pytest.raises(MissingOptionError) as missing:
        load_pretrained(_dinov3().state_dict(), format="hf")
    assert str(missing.value) == (
        "Hugging Face DINOv3 weights without their config.json do not record their head "
        "count; pass hf_config=PATH or num_heads=N"
    )
    _dinov3(key_bias=True).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(tmp_path)
    assert str(refused.value).endswith(
        "key_bias=True: timm's and vitkit's EVA keep the key bias zero"
    )


def test_a_folder_fine_tunes_on_the_digits(tmp_path, capsys):
    _dinov3().save_pretrained(tmp_path / "hub")
    argv = ["train", "--pretrained", str(tmp_path / "hub"), "--data", "digits", "--img-size",
            "32", "--epochs", "1", "--batch-size", "64", "--out", str(tmp_path / "run"),
            "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "model.safetensors").is_file()
