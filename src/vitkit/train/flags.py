"""The `vitkit train` flags, made from `TrainConfig`'s fields: one flag per field, with its
help, default, type and choices, and back from the parsed command line to field values."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .config import FIELDS, GROUPS, TrainConfig, field_kinds


def flag_name(item: dataclasses.Field) -> str:
    return "--" + (item.metadata["flag"] or item.name.replace("_", "-"))


def add_arguments(
    parser: argparse.ArgumentParser,
    recipe_options: frozenset[str] = frozenset(),
    recipes: Sequence[str] = (),
    *,
    only: Mapping[str, str | None] | None = None,
    title: str = "",
) -> Any:
    """One flag per `TrainConfig` field, in the groups of `GROUPS`. Nothing has an argparse
    default: `given_options` returns only what the command line set.

    Args:
        parser: the `train` sub-parser (or another command's, with `only`).
        recipe_options: fields some recipe sets, marked so in `--help`.
        recipes: the recipe names, listed as the choices of `--recipe`.
        only: just these fields, each with its help text (None: the field's own), in one
            group named `title` (e.g. `vitkit summary`'s model options), which is returned.
    """
    if only is None:
        groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    else:
        shared = parser.add_argument_group(title)
        groups = dict.fromkeys(GROUPS, shared)
    hints = field_kinds()
    for item in dataclasses.fields(TrainConfig):
        if only is not None and item.name not in only:
            continue
        meta, kind = item.metadata, hints[item.name]
        choices = recipes if item.name == "recipe" else meta["choices"]
        kwargs: dict[str, Any] = {
            "dest": item.name,
            "default": argparse.SUPPRESS,
            "help": (only or {}).get(item.name) or _help(item, item.name in recipe_options),
            "metavar": meta["metavar"] or ("{" + ",".join(map(str, choices)) + "}" if choices
                                           else None),
        }  # fmt: skip
        if kind.base is bool:  # on by default: --flag / --no-flag
            kwargs.update(action=argparse.BooleanOptionalAction if item.default else "store_true")
            kwargs.pop("metavar")
        elif item.name == "model_opts":
            kwargs.update(action="append", type=_model_opt)
        elif kind.base is tuple:
            kwargs.update(type=kind.item, nargs=2 if meta["metavar"] else "+")
            kwargs["metavar"] = meta["metavar"] or "N"
        else:
            kwargs.update(type=kind.base)
        group = groups[meta["group"]]
        group.add_argument(flag_name(item), **kwargs)
        if meta["none_flag"]:
            name, text = meta["none_flag"]
            group.add_argument(
                f"--{name}", dest=item.name, action="store_const", const=None, help=text,
                default=argparse.SUPPRESS,
            )  # fmt: skip
    return None if only is None else shared


def _help(item: dataclasses.Field, set_by_recipes: bool) -> str:
    """The field's help with its default (and a note when recipes change it)."""
    text = item.metadata["help"]
    default = item.default if item.default is not dataclasses.MISSING else None
    if default is None or default == {}:
        return text if "default" in text else f"{text} (default: none)"
    note = "; recipes may change it" if set_by_recipes else ""
    return f"{text} (default: {_shown(default)}{note})"


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _model_opt(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (e.g. drop_rate=0.1), got {item!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
    except RecursionError:
        raise argparse.ArgumentTypeError(f"value of {key!r} is nested too deeply") from None


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainConfig` values a parsed command line set, in the fields' types."""
    given: dict[str, Any] = {}
    for name in FIELDS:
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if name == "model_opts":
            value = dict(value)
        elif name == "img_size" and value is not None:
            if len(value) not in (1, 2):
                raise ValueError("--img-size takes N or H W")
            value = (value[0], value[0]) if len(value) == 1 else tuple(value)
        elif isinstance(value, list):
            value = tuple(value)
        given[name] = value
    return given
