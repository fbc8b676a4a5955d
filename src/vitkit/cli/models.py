"""`vitkit models`: the registered model names."""

from __future__ import annotations

import argparse
from typing import Any

from ..model import registry
from .commands import add_command
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "models")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'vit_base*'")
    return p


def run(args: argparse.Namespace) -> int:
    for name in registry.list_models(args.pattern):
        print(name)
    return ExitCode.OK
