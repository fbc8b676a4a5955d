"""The layout's promise: imports flow one way (cli -> serve / train -> inference -> weights /
explain / export -> plots -> model, data; files and options below all), so there is no import
cycle and each layer reads on its own; the server runs models through the inference room alone,
never through the training package or the command line."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vitkit

SRC = Path(vitkit.__file__).resolve().parent

# What each part of the package may import from the rest of vitkit.
ALLOWED: dict[str, set[str]] = {
    "files": set(),
    "options": set(),
    "model": {"options"},
    "data": {"options"},
    "weights": {"model", "data", "files"},
    "summary": {"model"},
    "plots": {"model", "files"},
    "explain": {"model", "data", "plots"},
    "inference": {"model", "data", "weights", "explain"},
    "export": {"model", "files"},
    "convert": {"weights"},
    "serve": {"options", "data", "explain", "inference"},
    "train": {"model", "data", "weights", "plots", "files", "options"},
    "cli": {
        "options",
        "model",
        "data",
        "weights",
        "convert",
        "train",
        "inference",
        "explain",
        "plots",
        "export",
        "summary",
        "files",
        "serve",
    },
}


def part_of(module: Path) -> str:
    return module.relative_to(SRC).parts[0].removesuffix(".py")


def vitkit_imports(path: Path) -> set[str]:
    """The top-level vitkit parts that `path` imports (absolute or relative imports)."""
    package = path.relative_to(SRC).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                target = base + (node.module.split(".") if node.module else [])
                names = [target] if target else [[alias.name] for alias in node.names]
            elif node.module and node.module.split(".")[0] == "vitkit":
                names = [node.module.split(".")[1:]]
            else:
                continue
            for name in names:
                if name:
                    found.add(name[0])
                elif node.level:  # `from .. import x`
                    found.update(alias.name for alias in node.names)
    return found


def test_imports_flow_one_way():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        part = part_of(path)
        if part in ("__init__", "__main__"):
            continue
        for target in vitkit_imports(path) - {part, "__version__"}:
            if target not in ALLOWED[part]:
                wrong.append(f"{path.relative_to(SRC)} imports {target}")
    assert not wrong, wrong


@pytest.mark.requires("starlette", "uvicorn", "multipart", extra="serve")
def test_the_server_runs_models_through_the_inference_room_alone():
    """Neither the training package nor the command line is the server's: not in its allowed
    imports, and not loaded, even indirectly, by its modules (starlette's among them)."""
    assert ALLOWED["serve"].isdisjoint({"train", "cli"})
    modules = [f"vitkit.serve.{p.stem}" for p in sorted((SRC / "serve").glob("[a-z]*.py"))]
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
        "print(sorted(m for m in sys.modules if m.startswith(('vitkit.train', 'vitkit.cli'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr


def test_every_part_is_listed():
    parts = {part_of(p) for p in SRC.rglob("*.py")} - {"__init__", "__main__"}
    assert parts == set(ALLOWED)


def test_the_plain_layers_know_nothing_of_the_fast_path():
    for path in (SRC / "model" / "layers").glob("*.py"):
        text = path.read_text().lower()
        assert "onednn" not in text and "mkldnn" not in text, path.name


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80


def test_rooms_stay_small():
    """No module over 500 lines and no function over 80 (STYLE.md): a room a reader can hold
    in their head; a module or function that grows past it is split by concern."""
    import ast

    long = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(SRC)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}: {size} lines")
    assert long == []
