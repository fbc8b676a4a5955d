"""Fixtures of the reliability suite: the command line in process, a slice of the digits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from vitkit import cli
from vitkit.data import Subset, Transformed, load_data


@pytest.fixture
def run_cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """`cli.main(argv)` in this process: (exit code, stdout, stderr); never a traceback."""

    def run(*argv) -> tuple[int, str, str]:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return run


@pytest.fixture(scope="session")
def digits() -> tuple[Transformed, Transformed]:
    """160 normalised training and 64 validation digits: 5 steps of 32 per epoch."""
    splits = load_data("digits", seed=0)
    mean, std = torch.tensor(splits.mean).view(-1, 1, 1), torch.tensor(splits.std).view(-1, 1, 1)

    def norm(x):
        return (x - mean) / std

    return (
        Transformed(Subset(splits.train, range(160)), norm),
        Transformed(Subset(splits.val, range(64)), norm),
    )
