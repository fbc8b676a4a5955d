"""Command-line flags made from a config's `option()` fields, and back: `add_flags` declares
one flag per option (typed, grouped, with its help and default), `given_options` returns the
options a command line set, in their types (transformers' `HfArgumentParser`, tyro)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from . import Kind, Options, Range, kinds, option_fields, option_names, placeholder


def add_flags(
    parser: argparse.ArgumentParser,
    config_cls: type[Options],
    *,
    exclude: Collection[str] = (),
    choices: Mapping[str, Sequence[Any]] | None = None,
    notes: Mapping[str, str] | None = None,
    prefix: str = "",
    show_defaults: bool = True,
    generic: tuple[str, str] | None = None,
    check_ranges: bool = False,
    groups: dict[str | None, argparse._ArgumentGroup] | None = None,
) -> None:
    """One flag per option of `config_cls`, in argument groups titled by its `GROUPS` (in that
    order). No flag has an argparse default: `given_options` returns only what was given.

    Args:
        parser: the (sub-)parser.
        config_cls: the config.
        exclude: options without a flag.
        choices: other choices to list for some options (e.g. the recipe names).
        notes: a remark per option, shown beside its default (e.g. 'recipes may change it').
        prefix: put before each destination (the options of a dict option, `of=`).
        show_defaults: show each default in the help (not where a preset decides it).
        generic: (flag, help) of a repeatable KEY=VALUE flag for any option of the config.
        check_ranges: refuse a number out of its option's range as the command line is
            parsed, naming the flag (where no later step names it).
        groups: the argument groups made so far, by key (a dict option's flags join the
            group of the same key).
    """
    groups = {} if groups is None else groups

    def group(key: str | None) -> argparse._ArgumentGroup:
        return _argument_group(parser, config_cls, groups, key)

    items = _fields_by_group(config_cls, exclude)
    if generic is not None and items:
        _add_generic(group(items[0].metadata["group"]), *generic, dest=f"{prefix}*")
    for item in items:
        meta = item.metadata
        if meta["of"] is not None:  # its generic flag here, its options' flags in their groups
            nested = f"{prefix}{item.name}."
            _add_generic(group(meta["group"]), flag_of(item)[2:], meta["help"], dest=f"{nested}*")
            add_flags(
                parser,
                meta["of"],
                exclude=meta["no_flags"],
                notes=notes,
                prefix=nested,
                show_defaults=False,
                check_ranges=check_ranges,
                groups=groups,
            )
            continue
        _add_option_flags(
            group(meta["group"]),
            item,
            kinds(config_cls)[item.name],
            prefix + item.name,
            choices=(choices or {}).get(item.name) or meta["choices"],
            text=_help(item, (notes or {}).get(item.name), show_defaults),
            check_ranges=check_ranges,
        )


def _argument_group(
    parser: argparse.ArgumentParser,
    config_cls: type[Options],
    groups: dict[str | None, argparse._ArgumentGroup],
    key: str | None,
) -> argparse._ArgumentGroup:
    """The argument group of `key`, made (titled by the config's `GROUPS`) the first time."""
    if key not in groups:
        title = config_cls.GROUPS.get(key, key) if key else None
        groups[key] = parser.add_argument_group(title)
    return groups[key]


def _fields_by_group(config_cls: type[Options], exclude: Collection[str]) -> list:
    """The config's fields with a flag, in the order of its `GROUPS` (ungrouped first)."""
    order = list(config_cls.GROUPS)
    return sorted(
        (f for f in dataclasses.fields(config_cls) if f.name not in exclude),
        key=lambda f: order.index(f.metadata["group"]) if f.metadata["group"] in order else -1,
    )


def _add_option_flags(
    target: argparse._ArgumentGroup,
    item: dataclasses.Field,
    kind: Kind,
    dest: str,
    *,
    choices: Sequence[Any] | None,
    text: str,
    check_ranges: bool,
) -> None:
    """An option's flag, and its flag for None where it has one.

    Args:
        target: the argument group.
        item: the option's field.
        kind: the option's type (`kinds`).
        dest: where the parsed value goes.
        choices: the choices to list.
        text: the help.
        check_ranges: refuse a number out of the option's range as the line is parsed.
    """
    kwargs = _flag_kwargs(item, kind, choices)
    bounds = item.metadata["range"]
    if check_ranges and bounds is not None and "type" in kwargs:
        kwargs["type"] = _in_range(kwargs["type"], bounds)
    target.add_argument(flag_of(item), dest=dest, default=argparse.SUPPRESS, help=text, **kwargs)
    if item.metadata["none_flag"]:
        name, none_help = item.metadata["none_flag"]
        target.add_argument(
            f"--{name}",
            dest=dest,
            action="store_const",
            const=None,
            help=none_help,
            default=argparse.SUPPRESS,
        )


def _add_generic(group: argparse._ArgumentGroup, flag: str, text: str, dest: str) -> None:
    """A repeatable --FLAG KEY=VALUE for any option of a config, by name."""
    group.add_argument(
        f"--{flag}",
        dest=dest,
        action="append",
        type=_key_value,
        metavar="KEY=VALUE",
        default=argparse.SUPPRESS,
        help=text,
    )


def flag_of(item: dataclasses.Field) -> str:
    """The command-line flag of an option: '--' and its `flag`, else its name with - for _."""
    return "--" + (item.metadata["flag"] or item.name.replace("_", "-"))


# The metavar of a number without its own: short, so that the help fits beside the flag.
_METAVARS = {int: "N", float: "X"}


def _flag_kwargs(item: dataclasses.Field, kind: Kind, choices: Sequence[Any] | None) -> dict:
    """argparse's action, type, nargs and metavar for an option of this kind: booleans as
    --x / --no-x (a preset or a file may have set either), tuples as several values."""
    if kind.has(bool):
        return {"action": argparse.BooleanOptionalAction}
    metavar = item.metadata["metavar"]
    if metavar is None:
        metavar = "{" + ",".join(map(str, choices)) + "}" if choices else None
        metavar = metavar or _METAVARS.get(kind.alternatives[0].base)
        metavar = metavar or (item.metadata["flag"] or item.name).replace("-", "_").upper()
    pair = kind.tuple_type
    if pair is None:
        base = kind.alternatives[0].base
        if base not in _PARSERS:
            raise TypeError(f"{item.name}: a {base.__name__} option has no flag; give it of=")
        return {"type": _PARSERS[base], "metavar": metavar}
    scalar = any(alt.base is not tuple for alt in kind.alternatives)
    nargs = "+" if scalar else (pair.length or "*")
    if isinstance(metavar, tuple) and nargs != len(metavar):
        raise TypeError(f"{item.name}: metavar {metavar} does not match {nargs} values")
    return {"type": _PARSERS[pair.item], "nargs": nargs, "metavar": metavar}


def _parser(convert: type, what: str):
    """An argparse type: `convert(text)`, else one line saying what the flag takes."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None

    return parse


_PARSERS = {int: _parser(int, "an integer"), float: _parser(float, "a number"), str: str}


def _in_range(parse: Callable[[str], Any], bounds: Range) -> Callable[[str], Any]:
    """An argparse type: `parse(text)`, refused in one line when out of `bounds`."""

    def parse_in_range(text: str) -> Any:
        value = parse(text)
        if isinstance(value, float) and math.isinf(value):  # an open range holds inf
            raise argparse.ArgumentTypeError(
                f"must be a finite number {bounds.phrase()}, got {text}"
            )
        if not bounds.holds(value):  # NaN holds no range
            raise argparse.ArgumentTypeError(f"must be {bounds.phrase()}, got {text}")
        return value

    return parse_in_range


def _key_value(text: str) -> tuple[str, Any]:
    """KEY=VALUE, the value as JSON (else the text itself)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (e.g. drop_rate=0.1), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
    except RecursionError:
        raise argparse.ArgumentTypeError(f"value of {key!r} is nested too deeply") from None


def _help(item: dataclasses.Field, note: str | None, show_default: bool) -> str:
    """The option's help, with its default (and the note) in parentheses."""
    text = item.metadata["help"]
    default = item.default if item.default is not dataclasses.MISSING else None
    if not show_default:
        return f"{text} ({note})" if note else text
    if default is None or default in ({}, ()):
        return text if "default" in text else f"{text} (default: none)"
    return f"{text} (default: {_flag_text(default)}{f'; {note}' if note else ''})"


def _flag_text(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(map(_flag_text, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def given_options(
    args: argparse.Namespace,
    config_cls: type[Options],
    *,
    prefix: str = "",
    generic: str | None = None,
) -> dict[str, Any]:
    """The options of `config_cls` that a command line set (from `add_flags`' flags), in
    their types; a ValueError when one is given twice (its flag and the KEY=VALUE form).

    Args:
        args: the parsed command line.
        config_cls: the config.
        prefix: as given to `add_flags`.
        generic: the KEY=VALUE flag given to `add_flags` (its values are taken too).
    """
    given: dict[str, Any] = {}
    for item in dataclasses.fields(config_cls):
        dest, kind = prefix + item.name, kinds(config_cls)[item.name]
        if item.metadata["of"] is not None:
            entries = given_options(
                args, item.metadata["of"], prefix=f"{dest}.", generic=flag_of(item)[2:]
            )
            if entries:
                given[item.name] = entries
        elif hasattr(args, dest):
            given[item.name] = _from_flag(getattr(args, dest), kind, flag_of(item))
    pairs = dict(getattr(args, f"{prefix}*", []))
    for key in given.keys() & pairs.keys():
        flag = flag_of(option_fields(config_cls)[key])
        raise ValueError(f"{flag} and --{generic} {key}=... both set {key}; give it once")
    return {**pairs, **given}


def _from_flag(value: Any, kind: Kind, flag: str) -> Any:
    """A parsed flag's value in the option's type: argparse's lists as tuples, and one value
    of an 'N or H W' option as N."""
    if not isinstance(value, list):
        return value
    pair = kind.tuple_type
    if len(value) == 1 and any(alt.base is not tuple for alt in kind.alternatives):
        return value[0]
    if pair is not None and pair.length is not None and len(value) != pair.length:
        raise ValueError(f"{flag} takes 1 or {pair.length} values, got {len(value)}")
    return tuple(value)


def flag_forms(
    parser: argparse.ArgumentParser, generic: type[Options] | None = None
) -> dict[str, str]:
    """How this command line gives each option a hint may name, from the parser's own flags:
    option name -> '--num-heads N' (a dict option's flags by the inner name); with `generic`,
    the options of that schema without a flag of their own through the parser's KEY=VALUE
    flag ('--model-opt num_heads=N')."""
    forms: dict[str, str] = {}
    pairs = None
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        name = action.dest.rpartition(".")[2]
        if name == "*":
            pairs = pairs or action.option_strings[0]
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else None
        takes = action.nargs != 0 and metavar
        forms.setdefault(
            name, f"{action.option_strings[0]} {metavar}" if takes else action.option_strings[0]
        )
    if generic is not None and pairs is not None:
        for name in option_names(generic):
            forms.setdefault(name, f"{pairs} {name}={placeholder(generic, name)}")
    return forms
