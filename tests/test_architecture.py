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
    "data": {"options", "files"},  # shards are written atomically
    "weights": {"model", "data", "files", "options"},
    "summary": {"model"},
    "plots": {"model", "files"},
    "explain": {"model", "data", "plots"},
    "inference": {"model", "data", "weights", "explain", "export"},
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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def file_imports(path: Path) -> set[str]:
    """The vitkit modules `path` imports anywhere in it (inside functions and TYPE_CHECKING
    blocks too): `from .x import y` counts as module `x.y` where that is a module, else `x`."""
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("vitkit"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("vitkit"))
    return found & modules


def test_no_file_level_import_cycle():
    """No file imports another that imports it back, directly or through others: two files
    that need each other are one concept (or a concept in the wrong room). A package's
    `__init__` re-exporting its modules is not a cycle of theirs, so imports of a package
    count as imports of its `__init__` file only."""
    graph = {module_name(p): file_imports(p) for p in SRC.rglob("*.py")}
    cycles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt == node:
                continue
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []


# Where a family may be named: its own rooms, the registries that register it, and the public
# API that exports its classes.
REGISTRATION = {"model/registry.py", "model/__init__.py", "__init__.py", "weights/families.py"}


def family_rooms(arch) -> tuple[str, ...]:
    """The folders of a family's rooms: its model room and its weights room."""
    room = Path(sys.modules[arch.config_class.__module__].__file__).parent.relative_to(SRC)
    return (f"{room}/", f"weights/{room.name}/")


def named_classes(arch) -> set[str]:
    """The concrete classes a family owns: config, models, feature backbone."""
    return {arch.config_class.__name__, *(c.__name__ for c in arch.model_classes)} | (
        {arch.backbone.__name__}
        if arch.backbone.__module__.startswith(arch.config_class.__module__.rsplit(".", 1)[0])
        else set()
    )


def test_a_family_is_named_only_in_its_rooms_and_where_it_is_registered():
    """No source file outside a family's rooms (model/<family>/, weights/<family>/) and the
    registries names one of its concrete classes or imports from its rooms: everything else
    asks the family's `Architecture` record (`architecture_of`)."""
    from vitkit.model import architectures

    wrong = []
    for arch in architectures():
        rooms = family_rooms(arch)
        names = named_classes(arch)
        room_modules = tuple("vitkit." + r.rstrip("/").replace("/", ".") for r in rooms)
        for path in sorted(SRC.rglob("*.py")):
            rel = path.relative_to(SRC).as_posix()
            if rel.startswith(rooms) or rel in REGISTRATION:
                continue
            tree = ast.parse(path.read_text())
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    used |= {a.name for a in node.names}
            for name in sorted(names & used):
                wrong.append(f"{rel} names {arch.name}'s {name}")
            for module in sorted(file_imports(path)):
                if module.startswith(room_modules):
                    wrong.append(f"{rel} imports {module}")
    assert sorted(set(wrong)) == []


_TABLES = (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def table_lines(tree: ast.Module) -> set[int]:
    """The lines of a module's data tables: module-level assignments of literal containers,
    and the field declarations of class bodies (an option schema's fields)."""
    lines = set()
    for node in tree.body:
        values = [node] if isinstance(node, (ast.Assign, ast.AnnAssign)) else []
        if values and isinstance(node.value, _TABLES):
            lines.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.AnnAssign, ast.Assign)):
                    lines.update(range(item.lineno, item.end_lineno + 1))
    return lines


def test_formatting_is_skipped_only_on_data_tables():
    """`# fmt: skip` keeps a table's columns aligned; code is left to `ruff format`."""
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        tables = table_lines(ast.parse(text))
        for number, line in enumerate(text.splitlines(), 1):
            if "# fmt: skip" in line and number not in tables:
                wrong.append(f"{path.relative_to(SRC)}:{number}")
    assert wrong == []
