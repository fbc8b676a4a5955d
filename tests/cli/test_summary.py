"""`vitkit summary` of weights: any file or folder `load_any` reads, as they are (the table
and the flow of registered model names are tested in tests/test_summary.py)."""

from __future__ import annotations

import pytest

from ._cli import hf_folder, timm_folder, timm_vit


def test_the_table_of_a_timm_folder(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    code, out, _ = run_cli("summary", folder, "--depth", "1")
    params = sum(p.numel() for p in timm_vit().parameters())
    assert code == 0 and f"Total params: {params:,}" in out
    assert "Input size: 1x3x32x32" in out


def test_the_flow_of_a_hugging_face_folder(tmp_path, run_cli):
    pytest.importorskip("transformers")
    code, out, _ = run_cli("summary", hf_folder(tmp_path / "hf"), "--flow")
    assert code == 0 and "head: Linear 64->3" in out and "4x4 grid = 16 patches" in out


def test_model_options_do_not_apply_to_weights(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    code, _, err = run_cli("summary", folder, "--img-size", "64", "--patch-size", "16")
    assert (code, err) == (
        2,
        f"vitkit: error: {folder} brings its own architecture, so --patch-size, --img-size "
        "cannot apply: drop them\n",
    )


def test_weights_options_do_not_apply_to_a_registered_name(run_cli):
    code, _, err = run_cli("summary", "vit_tiny_patch16_224", "--num-heads", "4")
    assert (code, err) == (
        2,
        "vitkit: error: --arch and --num-heads read weights; vit_tiny_patch16_224 is a "
        "registered model: set its options with --model-opt (e.g. num_heads=N)\n",
    )
