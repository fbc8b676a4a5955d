"""An optional package missing: every command's module still imports, and the command that
needs the package names the extra that installs it (`pip install 'vitkit[EXTRA]'`), never
'reinstall vitkit'. Each case runs in a fresh interpreter whose imports of the extra's packages
fail, as they do after `pip install vitkit` alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vitkit.cli.errors import describe

# extra -> (the top-level modules it brings, a command that needs them, after a checkpoint CKPT).
SERVE = ("starlette", "uvicorn", "anyio", "multipart", "python_multipart", "prometheus_client")
ONNX = ("onnx", "onnxscript", "onnx_ir", "onnxruntime")
EXTRA_CASES = {
    "serve": (SERVE, ["serve", "--checkpoint", "CKPT"]),
    "onnx": (ONNX, ["export", "--checkpoint", "CKPT", "OUT.onnx"]),
    "tensorboard": (
        ("tensorboard",),
        ["train", "--epochs", "1", "--log", "tensorboard", "--out", "OUT"],
    ),
}

SCRIPT = """
import importlib.abc, sys
BLOCKED = {blocked!r}

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Missing())
import vitkit
from vitkit import cli
from vitkit.cli.commands import COMMANDS, command_module
for name in COMMANDS:
    command_module(name)
cli.build_parser()
vitkit.save(vitkit.create_model("vit_digits", depth=1), {ckpt!r})
sys.exit(cli.main({argv!r}))
"""


@pytest.mark.parametrize("extra", sorted(EXTRA_CASES))
def test_a_missing_extra_is_named_by_the_command_that_needs_it(extra, tmp_path):
    blocked, argv = EXTRA_CASES[extra]
    ckpt = str(tmp_path / "model.safetensors")
    argv = [a.replace("CKPT", ckpt).replace("OUT", str(tmp_path / "out")) for a in argv]
    script = SCRIPT.format(blocked=set(blocked), ckpt=ckpt, argv=argv)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("vitkit: error: ") and "which is not installed" in lines[-1]
    assert f"pip install 'vitkit[{extra}]'" in lines[-1]


def test_a_package_of_no_table_is_named_by_the_commands_extra_and_a_core_one_is_a_broken_install():
    missing = ModuleNotFoundError("No module named 'h11'", name="h11")
    assert describe(missing, extra="serve")[1] == (
        "this needs the optional package h11, which is not installed: pip install 'vitkit[serve]'"
    )
    core = ModuleNotFoundError("No module named 'safetensors'", name="safetensors")
    assert describe(core, extra="serve")[1] == (
        "No module named 'safetensors'; reinstall vitkit (pip install -e .)"
    )
