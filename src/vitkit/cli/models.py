"""`vitkit models`: the registered model names, or the options of one model's architecture
(`--options`: what `--model-opt KEY=VALUE` takes, with the preset's values)."""

from __future__ import annotations

import argparse
from typing import Any

from ..model import architecture_of, get_config, registry
from ..options import kinds, option_fields, option_names
from .commands import add_command
from .errors import UserError
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "models")
    p.add_argument(
        "pattern",
        nargs="?",
        default="*",
        help="shell-style filter, e.g. 'vit_base*'; with --options, one model's name",
    )
    p.add_argument(
        "--options",
        action="store_true",
        help="list the options of the model's architecture (`vitkit train --model-opt "
        "KEY=VALUE`): name, type, the model's value and what it does",
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.options:
        if any(c in args.pattern for c in "*?["):
            raise UserError(
                "--options lists the options of one model: give its name, e.g. vitkit models "
                "swin_tiny_patch4_window7_224 --options"
            )
        print(options_table(args.pattern))
        return ExitCode.OK
    for name in registry.list_models(args.pattern):
        print(name)
    return ExitCode.OK


def options_table(name: str) -> str:
    """The options of model `name`'s architecture as a text table: name, type (or the
    choices), the preset's value and the help."""
    config = get_config(name)
    arch = architecture_of(config)
    schema = arch.config_class
    rows = [("option", "type", "default", "help")]
    for option in option_names(schema):
        meta = option_fields(schema)[option].metadata
        choices = meta["choices"]
        kind = "|".join(map(str, choices)) if choices else kinds(schema)[option].spelled()
        if meta["range"] is not None:
            kind += f" {meta['range'].phrase()}"
        rows.append((option, kind, _shown(getattr(config, option)), meta["help"]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        f"{name}: options of the {arch.title}, set with --model-opt KEY=VALUE "
        "(lists as 2,2,6,2); the defaults are this model's"
    ]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def _shown(value: Any) -> str:
    """A value as `--model-opt` writes it: 2,2,6,2 for a tuple, null for None."""
    if isinstance(value, tuple):
        return ",".join(map(_shown, value)) if value else "()"
    if value is None:
        return "null"
    return (
        str(value).lower()
        if isinstance(value, bool)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )
