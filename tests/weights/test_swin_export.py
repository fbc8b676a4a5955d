"""Swin weights out: `vitkit export --format hf / timm` on a Swin checkpoint writes folders that
transformers (`AutoModelForImageClassification`) and timm (`local-dir:`) load with vitkit's
logits (1e-5 relative) and the checkpoint's data config as their preprocessing; vitkit reads
both back; what Hugging Face's Swin cannot express is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from _parity import randomize_far

import vitkit
from _helpers import optional_import, requires_timm, requires_transformers
from vitkit import cli
from vitkit.data.data_config import DataConfig
from vitkit.weights.swin.folders import save_hf_swin_folder, save_timm_swin_folder

transformers = optional_import("transformers")
timm = optional_import("timm")
RTOL = 1e-5
NAMES = ["cat", "dog", "eel"]


def _checkpoint(tmp_path, version: int, **options):
    """A random Swin (norms and logit scales far from their init) saved with class names and
    a data config."""
    model = vitkit.SwinTransformer(version=version, img_size=64, patch_size=2, embed_dim=32,
                                   depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=4,
                                   num_classes=3, **options)  # fmt: skip
    randomize_far(model)
    model.data_config = DataConfig(input_size=(3, 64, 64), mean=(0.4, 0.5, 0.6), std=0.25,
                                   interpolation="bilinear", crop_pct=0.8)  # fmt: skip
    vitkit.save(model, tmp_path / "swin.safetensors", meta={"class_names": NAMES})
    return model.eval(), tmp_path / "swin.safetensors"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


@requires_transformers
@requires_timm  # the folder's image processor is transformers' TimmWrapperImageProcessor
@pytest.mark.parametrize("version", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_transformers_loads_the_hf_folder_of_a_swin(tmp_path, version, capsys):
    options = dict(pretrained_window_sizes=(8, 8, 8, 2)) if version == 2 else {}
    model, checkpoint = _checkpoint(tmp_path, version, **options)
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "hf", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}/ (hf folder, with its preprocessing")
    theirs = transformers.AutoModelForImageClassification.from_pretrained(out).eval()
    assert type(theirs).__name__ == ("SwinForImageClassification" if version == 1
                                     else "Swinv2ForImageClassification")  # fmt: skip
    assert theirs.config.id2label == dict(enumerate(NAMES))
    with torch.no_grad():
        assert _rel(theirs(pixel_values=X).logits, model(X)) < RTOL
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    assert type(processor).__name__ == "TimmWrapperImageProcessor"
    config = json.loads((out / "preprocessor_config.json").read_text())["pretrained_cfg"]
    assert DataConfig.from_dict(config, "test") == model.data_config
    back = vitkit.load_pretrained(out)
    assert back.config == model.config.replace(drop_path_rate=back.config.drop_path_rate)
    assert back.data_config == model.data_config
    with torch.no_grad():
        assert _rel(back(X), model(X)) < RTOL


@requires_timm
def test_timm_loads_the_timm_folder_of_a_swin_v2(tmp_path, capsys):
    model, checkpoint = _checkpoint(tmp_path, 2, pretrained_window_sizes=(8, 8, 8, 2))
    out = tmp_path / "timm"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "timm", str(out)]) == 0
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    with torch.no_grad():
        assert _rel(theirs(X), model(X)) < RTOL
    resolved = timm.data.resolve_data_config({}, model=theirs)
    assert tuple(resolved["mean"]) == (0.4, 0.5, 0.6) and resolved["crop_pct"] == 0.8
    back = vitkit.load_pretrained(out)
    assert back.config == model.config and back.data_config == model.data_config


def test_what_hugging_faces_swin_cannot_express_is_refused_before_writing(tmp_path):
    s3 = vitkit.create_model("swin_s3_tiny_224", embed_dim=32, depths=(1, 1, 1, 1),
                             num_heads=(1, 1, 1, 1))  # fmt: skip
    with pytest.raises(ValueError, match=r"^Hugging Face's Swin cannot express windows per stage "
                                         r"\(7, 7, 14, 7\) \(HF: one window_size\)$"):  # fmt: skip
        save_hf_swin_folder(s3, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@requires_timm
def test_a_swin_v2_cr_goes_to_a_timm_folder_and_not_to_hugging_face(tmp_path):
    cr = vitkit.create_model(
        "swinv2_cr_tiny_ns_224", img_size=64, embed_dim=32, depths=(1, 1, 2, 1),
        num_heads=(1, 2, 4, 8), num_classes=3,
    )  # fmt: skip
    randomize_far(cr)
    cr.eval()
    out = save_timm_swin_folder(cr, tmp_path / "timm")
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert type(theirs).__name__ == "SwinTransformerV2Cr"
    with torch.no_grad():
        assert _rel(theirs(X), cr(X)) < RTOL
    back = vitkit.load_pretrained(out)
    assert back.config == cr.config
    with pytest.raises(ValueError, match=r"^Hugging Face has no Swin V2-cr .*; use --format timm$"):
        save_hf_swin_folder(cr, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_an_image_size_hugging_face_windows_differently_points_to_a_timm_folder(tmp_path):
    """At 56 px the last stages' maps are smaller than the window: timm clamps, HF V1 pads."""
    model = vitkit.create_model("swin_tiny_patch4_window7_224", img_size=56, embed_dim=32,
                                depths=(1, 1, 2, 1), num_heads=(1, 1, 1, 1))  # fmt: skip
    with pytest.raises(ValueError, match=r"at img_size .* no faithful copy; export a timm "
                                         r"folder \(--format timm\), whose Swin computes these "
                                         r"windows$"):  # fmt: skip
        save_hf_swin_folder(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
