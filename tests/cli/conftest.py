"""Fixtures of the command-line tests: `main` in this process, a tiny trained run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from vitkit import cli

from ._cli import TINY


@pytest.fixture
def run_cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """`cli.main(argv)` in this process: (exit code, stdout, stderr); never a traceback."""

    def run(*argv) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return run


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A 2-epoch digits run of a one-block model: its folder."""
    out = tmp_path_factory.mktemp("run") / "digits"
    assert cli.main(["train", "--out", str(out), "--epochs", "2", *TINY]) == 0
    return out
