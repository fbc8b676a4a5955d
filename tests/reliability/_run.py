"""Helpers of the reliability suite: the command line as a child process and a tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import vitkit
from vitkit import create_model

# A model and run small enough for 2 busy CPU cores: about 0.3 s per digits epoch.
TINY = (
    "--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
    "--lr", "5e-3", "--batch-size", "64", "--warmup-epochs", "0.5", "--no-progress",
)  # fmt: skip
# The worktree's own sources, whatever the installed vitkit points at.
SRC = Path(vitkit.__file__).resolve().parents[1]


def spawn(
    argv, *, log: Path, driver: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`python -m vitkit ARGV` (or `python DRIVER ARGV`) on the worktree's sources, with its
    stdout and stderr going to `log`."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(SRC)}
    command = [sys.executable, *([str(driver)] if driver else ["-m", "vitkit"])]
    with open(log, "w") as f:  # the child keeps its own descriptor
        return subprocess.Popen(
            [*command, *map(str, argv)], env=env, stdout=f, stderr=subprocess.STDOUT
        )


def wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the child process did not get there in time")
        time.sleep(0.02)


def tiny_model(**options) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    return create_model("vit_digits", embed_dim=16, depth=1, num_heads=2, **options)
