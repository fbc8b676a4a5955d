"""`vitkit export`: the line it prints names what the written file carries."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch

from vitkit.cli.progress import EVERY_S_VARIABLE

from ._cli import tiny_checkpoint


def test_the_onnx_line_names_the_class_names_and_data_config_it_carries(tmp_path, run_cli):
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    out = tmp_path / "m.onnx"
    code, printed, _ = run_cli("export", "--checkpoint", checkpoint, out, "--mean", "0.4")
    assert (code, printed) == (
        0,
        f"wrote {out} (onnx; batch dynamic, image size 8x8; carries the class names and the "
        "data config)\n",
    )
    props = {p.key: p.value for p in onnx.load(str(out), load_external_data=False).metadata_props}
    assert json.loads(props["vitkit_class_names"]) == ["cat", "dog"]
    assert json.loads(props["vitkit_data_config"])["mean"] == [0.4, 0.4, 0.4]


@pytest.mark.slow  # two ONNX exports and a check: about 13 s on 2 busy cores
def test_verify_shows_the_exports_steps_in_a_log_and_quiet_none(tmp_path, run_cli, monkeypatch):
    """stderr not a terminal: a line as each step (the graph, the check) ends, here at once."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv(EVERY_S_VARIABLE, "0")
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    argv = ["export", "--checkpoint", checkpoint, tmp_path / "m.onnx", "--verify"]
    code, _, err = run_cli(*argv)
    assert code == 0
    assert re.fullmatch(r"export: 1/2 steps, about \d+ s left\nexport: 2/2 steps\n", err), err
    assert run_cli(*argv, "--quiet")[::2] == (0, "")


def test_verify_says_what_it_compared(tmp_path, run_cli, caplog):
    """--verify names the tolerance, the largest difference it measured and the images."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    caplog.set_level(logging.INFO, logger="vitkit")
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    argv = ["export", "--checkpoint", checkpoint, tmp_path / "m.onnx", "--verify"]
    code, _, _ = run_cli(*argv, "--dynamic-img-size")
    said = [m for m in caplog.messages if m.startswith("verified")]
    assert code == 0 and len(said) == 1, caplog.messages
    found = re.fullmatch(
        r"verified: onnxruntime's outputs equal PyTorch's within 1e-4 \(max difference "
        r"(\d\.\de-\d\d)\) on 6 random images \(3 at 8x8, 3 at 12x12\)",
        said[0],
    )
    assert found and 0 <= float(found[1]) <= 1e-4, said[0]
    caplog.clear()
    code, _, _ = run_cli(*argv, "--static-batch")
    assert [m for m in caplog.messages if m.startswith("verified")][0].endswith(
        "on 1 random image (1 at 8x8)"
    )


def test_a_pt2_program_says_it_carries_no_preprocessing(tmp_path, run_cli):
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    out = tmp_path / "m.pt2"
    code, printed, _ = run_cli("export", "--checkpoint", checkpoint, "--format", "pt2", out,
                               "--static-batch")  # fmt: skip
    assert (code, printed) == (
        0,
        f"wrote {out} (pt2; batch 1, image size 8x8; carries no class names or data config)\n",
    )
    program = torch.export.load(str(out))
    x = torch.rand(1, 3, 8, 8)
    from vitkit import load

    torch.testing.assert_close(program.module()(x), load(checkpoint)(x), rtol=0, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2", "m.safetensors"]


def test_the_hf_folder_line_says_its_processor_needs_timm(tmp_path, run_cli):
    pytest.importorskip("transformers")
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    out = tmp_path / "hf"
    code, printed, _ = run_cli("export", "--checkpoint", checkpoint, "--format", "hf", out)
    assert (code, printed) == (
        0,
        f"wrote {out}/ (hf folder, with its preprocessing; transformers' from_pretrained; its "
        "image processor (AutoImageProcessor: TimmWrapperImageProcessor) needs timm "
        "installed)\n",
    )
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "TimmWrapperImageProcessor"
