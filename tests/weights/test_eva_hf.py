"""Hugging Face DINOv3 (`DINOv3ViTModel`) read as timm's DINOv3 EVA (weights/eva/hf.py): a
folder `save_pretrained` wrote, and a state dict in transformers 5's module keys with its
config, give transformers' `last_hidden_state` and `pooler_output` within 1e-5 (plain and gated
MLP, with and without register tokens, a non-square input); what the EVA cannot hold is refused
in one line; a folder fine-tunes on the digits.

And written (weights/eva/folders.py): `vitkit export --format hf` of a DINOv3 backbone is a
folder `DINOv3ViTModel.from_pretrained` loads with vitkit's outputs within 1e-5 and that vitkit
reads back as the same model; what DINOv3ViTModel cannot express is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, relative_error
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.data.data_config import DataConfig
from vitkit.weights import inspect
from vitkit.weights.checkpoint import MissingOptionError
from vitkit.weights.eva.folders import save_hf_dinov3_folder

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


# -- written: a DINOv3 EVA as transformers' DINOv3ViTModel folder -----------------------------


def _vitkit_dinov3(tmp_path, **options):
    """A random DINOv3 backbone of timm's fixed options, pooling the class token as
    transformers' `pooler_output`, saved with a data config."""
    model = vitkit.create_model(
        "vit_small_patch16_dinov3_qkvb", embed_dim=64, depth=2, num_heads=2, img_size=32,
        patch_size=8, num_classes=0, global_pool="token", **options,
    )  # fmt: skip
    randomize(model)
    model.data_config = DataConfig(input_size=(3, 32, 32), mean=(0.4, 0.5, 0.6), std=0.25,
                                   crop_pct=0.8)  # fmt: skip
    vitkit.save(model, tmp_path / "dinov3.safetensors")
    return model, tmp_path / "dinov3.safetensors"


@pytest.mark.parametrize(
    "options",
    [{}, {"swiglu_mlp": True, "swiglu_align_to": 8, "num_reg_tokens": 0}, {"qkv_bias": False}],
    ids=["mlp", "gated-mlp", "no-qkv-bias"],
)
def test_transformers_loads_the_hf_folder_of_a_dinov3(tmp_path, capsys, options):
    model, checkpoint = _vitkit_dinov3(tmp_path, **options)
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "hf", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}/ (hf folder")
    theirs, info = transformers.DINOv3ViTModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # every key written is one transformers expects
    _same_outputs(model, theirs.eval())
    processor = json.loads((out / "preprocessor_config.json").read_text())["pretrained_cfg"]
    assert DataConfig.from_dict(processor, "test") == model.data_config
    back = load_pretrained(out)
    assert back.config == model.config and back.data_config == model.data_config
    _same_outputs(back, theirs)


def test_a_transformers_dinov3_read_and_written_back_gives_its_outputs(tmp_path):
    source = _dinov3()
    source.save_pretrained(tmp_path / "source")
    save_hf_dinov3_folder(load_pretrained(tmp_path / "source"), tmp_path / "back")
    back = transformers.DINOv3ViTModel.from_pretrained(tmp_path / "back").eval()
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(back(x).last_hidden_state, source(x).last_hidden_state) < RTOL


def test_what_dinov3vitmodel_cannot_express_is_refused_before_writing(tmp_path):
    tiny = dict(embed_dim=64, depth=2, num_heads=2)
    refused = {
        "vit_small_patch16_dinov3_qkvb": (
            dict(num_classes=5),
            "transformers has no DINOv3 classifier (DINOv3ViTModel is the backbone), this model "
            "has a 5-class head; drop it first (model.reset_classifier(0, global_pool='token')); "
            "export --format onnx, or keep vitkit's own checkpoint (vitkit.save)",
        ),
        "vit_small_patch16_dinov3": (
            dict(num_classes=0, init_values=None),
            "Hugging Face's DINOv3ViTModel cannot express init_values=None (DINOv3ViTModel "
            "always has LayerScale), global_pool='avg' (DINOv3ViTModel: 'token'); export",
        ),
        "eva02_tiny_patch14_224": (
            dict(num_classes=0, global_pool="token"),
            "Hugging Face's DINOv3ViTModel cannot express init_values=None (DINOv3ViTModel "
            "always has LayerScale), use_abs_pos_emb=True (DINOv3ViTModel: False), rope_type='cat' "
            "(DINOv3ViTModel: 'dinov3')",
        ),
    }
    for name, (options, message) in refused.items():
        model = vitkit.create_model(name, **tiny, **options)
        with pytest.raises(ValueError) as err:
            save_hf_dinov3_folder(model, tmp_path / "hf")
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
        assert not (tmp_path / "hf").exists()
    # the head and the pooling dropped as the first refusal says, the model is written
    model = vitkit.create_model("vit_small_patch16_dinov3_qkvb", **tiny, num_classes=5)
    model.reset_classifier(0, global_pool="token")
    assert (save_hf_dinov3_folder(model, tmp_path / "hf") / "model.safetensors").is_file()
