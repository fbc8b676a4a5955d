"""Every code block in README.md and docs/ runs, or says why it does not.

A page's blocks run in order, in one fresh folder, sharing one Python namespace:
- ```python blocks are executed (their checks are `assert`s);
- ```pycon blocks run as doctests (`>>>` lines; the printed output must match, `...` matches
  anything);
- ```console blocks are `$ command` lines, each followed by its output: `vitkit ...` runs in
  this process, anything else in bash; the shown output (stdout, stderr and log lines, as a
  terminal shows them) must match what the command prints, `...` matching any text within a
  line and a line of only `...` any number of lines; no output shown checks the exit status
  only. A command must succeed, unless its shown output has a `vitkit: error:` line, when it
  must fail;
- ```bash / ```sh blocks run whole in bash (`set -euo pipefail`).
A block preceded by `<!-- not run: REASON -->` is skipped, and REASON must say why. Any other
language (text, toml, json, ...) is a display, not a command. A page whose first line is
`<!-- test: slow -->` runs with the slow tests. Files a page assumes (a photo, a checkpoint)
are made by `setup(folder)` in tests/docs_setup/<page>.py (the page's path under docs/, `/`
and `-` as `_`, README for README.md), called before its first block.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import logging
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from vitkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SETUPS = Path(__file__).resolve().parent / "docs_setup"
RUN = {"python", "pycon", "console", "bash", "sh", "shell"}
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
NOT_RUN = re.compile(r"<!--\s*not run:(?P<reason>.*?)-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None  # the reason, when the page says the block is not run

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for fence in FENCE.finditer(text):
        lang = fence["lang"].lower()
        if lang not in RUN:
            continue
        before = text[: fence.start()].rstrip()
        marker = NOT_RUN.search(before[before.rfind("\n") + 1 :]) if before else None
        body = "\n".join(line[len(fence["indent"]) :] for line in fence["body"].splitlines())
        line = text.count("\n", 0, fence.start()) + 1
        found.append(Block(page, line, lang, body + "\n", marker and marker["reason"].strip()))
    return found


def page_id(page: Path) -> str:
    if page == ROOT / "README.md":
        return "README"
    return re.sub(r"[/-]", "_", str(page.relative_to(DOCS).with_suffix("")))


def is_slow(page: Path) -> bool:
    return page.read_text().startswith("<!-- test: slow -->")


def _page_params() -> list:
    return [
        pytest.param(page, id=page_id(page), marks=[pytest.mark.slow] if is_slow(page) else [])
        for page in pages()
        if blocks(page)
    ]


# -- matching shown output ---------------------------------------------------------------------


def output_pattern(shown: str) -> re.Pattern:
    """A regex for shown output: `...` alone on a line matches any lines, `...` in a line any
    text of that line; trailing spaces are ignored."""
    parts = []
    for line in shown.rstrip("\n").splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            pieces = [re.escape(piece) for piece in line.rstrip().split("...")]
            parts.append("[^\n]*".join(pieces) + r"[ \t]*\n")
    return re.compile("".join(parts) + r"\s*\Z")


def matches(shown: str, printed: str) -> bool:
    printed = "\n".join(line.rstrip() for line in printed.splitlines()) + "\n"
    return bool(output_pattern(shown).match(printed.lstrip("\n") if printed.strip() else ""))


def console_commands(body: str) -> list[tuple[str, str]]:
    """(command, shown output) for each `$ ` line; a line ending in `\\` continues it."""
    commands: list[tuple[str, list[str]]] = []
    lines = iter(body.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + " " + next(lines).strip()
            commands.append((command, []))
        elif commands:
            commands[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"output before the first `$ ` line: {line!r}")
    return [(command, "\n".join(out) + "\n" if out else "") for command, out in commands]


# -- running blocks ----------------------------------------------------------------------------


def run_vitkit(command: str) -> tuple[int, str]:
    """Run `vitkit ...` in this process; returns (exit code, stdout + stderr + log lines)."""
    buffer = io.StringIO()
    root = logging.getLogger()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = main(shlex.split(command)[1:])
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return code, buffer.getvalue()


def run_shell(script: str, folder: Path) -> tuple[int, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout


def run_console(block: Block, folder: Path) -> None:
    for command, shown in console_commands(block.body):
        if command.startswith("vitkit "):
            code, printed = run_vitkit(command)
        else:
            code, printed = run_shell(command, folder)
        failed_on_purpose = "vitkit: error:" in shown
        assert (code != 0) == failed_on_purpose, (
            f"{block.where}: `{command}` exited {code}:\n{printed[-3000:]}"
        )
        if shown.strip():
            assert matches(shown, printed), (
                f"{block.where}: `{command}` printed\n{printed}\nthe page shows\n{shown}"
            )


def run_python(block: Block, namespace: dict) -> None:
    code = compile(block.body, f"{block.where}", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, namespace)  # noqa: S102 - the page's own code, which is the point of the test


def run_pycon(block: Block, namespace: dict) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.body, namespace, block.where, str(block.page), block.line)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    out = io.StringIO()
    runner.run(test, out=out.write, clear_globs=False)
    namespace.update(test.globs)  # doctest ran on a copy: later blocks see its names
    assert runner.failures == 0, f"{block.where}:\n{out.getvalue()}"


def run_block(block: Block, folder: Path, namespace: dict) -> None:
    if block.lang == "python":
        run_python(block, namespace)
    elif block.lang == "pycon":
        run_pycon(block, namespace)
    elif block.lang == "console":
        run_console(block, folder)
    else:
        code, printed = run_shell(block.body, folder)
        assert code == 0, f"{block.where}: exited {code}:\n{printed[-3000:]}"


def setup_page(page: Path, folder: Path) -> None:
    script = SETUPS / f"{page_id(page)}.py"
    if script.exists():
        spec = importlib.util.spec_from_file_location(f"docs_setup_{page_id(page)}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.setup(folder)


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("page", _page_params())
def test_every_block_of_the_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    setup_page(page, tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for block in blocks(page):
        if block.not_run is None:
            run_block(block, tmp_path, namespace)


def test_every_skipped_block_says_why():
    vague = [
        b.where
        for page in pages()
        for b in blocks(page)
        if b.not_run is not None and len(b.not_run) < 10
    ]
    assert vague == []


def test_every_setup_script_belongs_to_a_page():
    ids = {page_id(page) for page in pages()}
    assert sorted(p.stem for p in SETUPS.glob("*.py") if p.stem not in ids) == []


@pytest.mark.parametrize(
    "shown,printed,ok",
    [
        ("a\nb\n", "a\nb\n", True),
        ("a\nb\n", "a\nc\n", False),
        ("a\n...\nz\n", "a\nb\nc\nz\n", True),
        ("a\n...\nz\n", "a\nz\n", True),
        ("loss 0.4...\n", "loss 0.4312\n", True),
        ("loss 0.4...\n", "loss 0.5312\n", False),
        ("a\n", "a\nb\n", False),
        ("", "", True),
    ],
)
def test_shown_output_matching(shown, printed, ok):
    assert matches(shown, printed) is ok


def test_names_carry_from_block_to_block():
    page = ROOT / "README.md"
    namespace: dict = {}
    run_pycon(Block(page, 1, "pycon", ">>> import json\n>>> n = 2\n", None), namespace)
    run_python(Block(page, 5, "python", "m = n + 1\n", None), namespace)
    run_pycon(Block(page, 9, "pycon", ">>> json.dumps([m])\n'[3]'\n", None), namespace)
    with pytest.raises(AssertionError, match="Expected"):
        run_pycon(Block(page, 12, "pycon", ">>> m\n4\n", None), namespace)


def test_the_harness_reads_markers_and_commands(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: downloads 300 MB of weights -->\n```bash\ncurl x\n```\n\n"
        "```text\nshown, not run\n```\n\n"
        "```console\n$ vitkit models \\\n  --filter x\nline\n$ ls\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.not_run, b.line) for b in found] == [
        ("bash", "downloads 300 MB of weights", 2),
        ("console", None, 10),
    ]
    assert console_commands(found[1].body) == [("vitkit models  --filter x", "line\n"), ("ls", "")]
