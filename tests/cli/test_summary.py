"""`vitkit summary` of weights: any file or folder `load_any` reads, as they are (the table
and the flow of registered model names are tested in tests/test_summary.py)."""

from __future__ import annotations

import pytest

from ._cli import hf_folder, timm_folder, timm_vit


def test_the_table_of_a_timm_folder(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    code, out, _ = run_cli("summary", folder, "--max-depth", "1")
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
    code, _, err = run_cli("summary", folder, "--img-size", "64", "--model-opt", "patch_size=16")
    assert (code, err) == (
        2,
        f"vitkit: error: {folder} brings its own architecture, so the model options "
        "img_size, patch_size cannot apply: drop them\n",
    )


def test_weights_options_do_not_apply_to_a_registered_name(run_cli):
    code, _, err = run_cli("summary", "vit_tiny_patch16_224", "--arch", "vit_small_patch16_224")
    assert (code, err) == (
        2,
        "vitkit: error: --arch names the architecture of weights; vit_tiny_patch16_224 is a "
        "registered model: set its options with --model-opt (e.g. --model-opt depth=N)\n",
    )


def test_num_heads_is_the_head_count_of_weights_and_of_a_registered_model(tmp_path, run_cli):
    code, out, _ = run_cli("summary", "vit_tiny_patch16_224", "--num-heads", "4", "--flow")
    assert code == 0 and "heads" in out
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    code, out, _ = run_cli("summary", folder, "--num-heads", "2", "--max-depth", "1")
    assert code == 0 and "Total params:" in out
