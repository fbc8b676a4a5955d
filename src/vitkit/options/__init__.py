"""Options declared once: a dataclass field that carries its type, default, help and limits.

`option()` declares a field; `Options` is the base of a config made of such fields (every
value checked when the config is built, `to_dict` / `from_dict` / `replace`); from the same
fields come the settings-file reader (`read_settings`) and the command-line flags (`flags.py`:
`add_flags`, `given_options`). A config is then written once, as nanoGPT's configurator
accepts only an override whose key exists and whose type matches, and as transformers'
`HfArgumentParser` and tyro make flags from a dataclass's type hints.

This module imports nothing of vitkit: the model, the data and the training jobs all use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

REQUIRED: Any = dataclasses.MISSING  # the default of an option that has none


class SettingsError(ValueError):
    """A settings file that cannot be used: names the file, the key and what was wrong."""


@dataclass(frozen=True)
class Range:
    """The allowed interval of a number, and how an error states it."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""
    probability: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        if self.high is None:
            return above
        return above and (value < self.high if self.high_open else value <= self.high)

    def phrase(self) -> str:
        """What the value must be: '> 0', 'in [0, 1)' (with the note)."""
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {_number(self.low)}"
        else:
            left, right = "([["[not self.low_open], ")]"[not self.high_open]
            text = f"in {left}{_number(self.low)}, {_number(self.high)}{right}"
        return f"{text} {self.note}" if self.note else text

    def describe(self) -> str:
        return "is a probability in [0, 1]" if self.probability else f"must be {self.phrase()}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
OFF_AT_ZERO = Range(0, note="(0: off)")
PROBABILITY = Range(0, 1, probability=True)
FRACTION = Range(0, 1, high_open=True)


def option(
    default: Any,
    help: str,
    *,
    range: Range | None = None,
    choices: Sequence[Any] | None = None,
    flag: str | None = None,
    metavar: str | tuple[str, ...] | None = None,
    group: str | None = None,
    runtime: bool = False,
    grows: bool = False,
    since: bool = False,
    none_flag: tuple[str, str] | None = None,
    of: type | None = None,
    no_flags: Collection[str] = (),
    **tags: Any,
) -> Any:
    """A field of an `Options` dataclass, with what checks it and what makes its flag.

    Args:
        default: the value when nothing sets it (`REQUIRED`: none; a dict is copied per
            instance).
        help: one line for `--help`.
        range: the allowed interval of a number (of each item of a tuple).
        choices: the allowed values (of each item of a tuple).
        flag: the command-line name without dashes (default: the name with - for _).
        metavar: argparse's metavar (default: the choices, else the name in capitals).
        group: the `--help` section, a key of the config's `GROUPS`.
        runtime: how a run executes, not what it computes: `--resume` may change it.
        grows: `--resume` may raise it (e.g. more epochs), never lower it.
        since: added after the first release: a saved settings file may lack it.
        none_flag: (flag, help) of a switch that sets the option to None (e.g. --no-crop).
        of: the option is a dict of this other config's options; each gets its own flag,
            and `flag` becomes the generic KEY=VALUE form.
        no_flags: with `of`, the options of it that get no flag of their own.
        tags: other metadata a config reads (e.g. `family=True`).
    """
    meta = {
        "help": help,
        "range": range,
        "choices": tuple(choices) if choices is not None else None,
        "flag": flag,
        "metavar": metavar,
        "group": group,
        "runtime": runtime,
        "grows": grows,
        "since": since or runtime,
        "none_flag": none_flag,
        "of": of,
        "no_flags": tuple(no_flags),
        **tags,
    }
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# -- types ------------------------------------------------------------------------------------

_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          dict: "an object"}  # fmt: skip
_PLURALS = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


@dataclass(frozen=True)
class _Type:
    """One alternative of a field's type: a scalar, a dict, or a tuple of `item`s (`length`
    of them, or any number)."""

    base: type
    item: type | None = None
    length: int | None = None

    def accepts(self, value: Any) -> bool:
        if self.base is tuple:
            return (
                isinstance(value, (tuple, list))
                and (self.length is None or len(value) == self.length)
                and all(_is(v, self.item) for v in value)
            )
        return _is(value, self.base)

    def spelled(self) -> str:
        if self.base is not tuple:
            return self.base.__name__
        items = [self.item.__name__] * self.length if self.length else [self.item.__name__, "..."]
        return f"tuple[{', '.join(items)}]"

    def describe(self) -> str:
        if self.base is not tuple:
            return _NAMES[self.base]
        count = f"{self.length} " if self.length else ""
        return f"a list of {count}{_PLURALS[self.item]}"


def _is(value: Any, kind: type | None) -> bool:
    if isinstance(value, bool):  # a JSON true is no number
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return kind is not None and isinstance(value, kind)


@dataclass(frozen=True)
class Kind:
    """A field's type, decoded from its annotation: its alternatives, and whether None is ok."""

    alternatives: tuple[_Type, ...]
    optional: bool = False

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        return any(alt.accepts(value) for alt in self.alternatives)

    def describe(self) -> str:
        text = " or ".join(alt.describe() for alt in self.alternatives)
        return f"{text} or null" if self.optional else text

    def has(self, base: type) -> bool:
        return any(alt.base is base for alt in self.alternatives)

    def spelled(self) -> str:
        """The type as a table shows it: 'int', 'int | tuple[int, int]', 'float | None'."""
        text = " | ".join(alt.spelled() for alt in self.alternatives)
        return f"{text} | None" if self.optional else text

    @property
    def tuple_type(self) -> _Type | None:
        return next((alt for alt in self.alternatives if alt.base is tuple), None)


def kind_of(hint: Any) -> Kind:
    """The `Kind` of a type annotation: int, float, bool, str, dict, `tuple[int, int]`,
    `tuple[int, ...]`, and unions of them with or without None."""
    args, origin = typing.get_args(hint), typing.get_origin(hint)
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        alternatives = tuple(alt for a in inner for alt in kind_of(a).alternatives)
        return Kind(alternatives, optional=len(inner) < len(args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return Kind((_Type(tuple, args[0]),))
        if len(set(args)) != 1:
            raise TypeError(f"an option's tuple holds one type, got {hint}")
        return Kind((_Type(tuple, args[0], len(args)),))
    if origin is dict or hint is dict:
        return Kind((_Type(dict),))
    if hint not in _NAMES:
        raise TypeError(f"an option cannot have the type {hint}")
    return Kind((_Type(hint),))


@functools.cache
def kinds(config_cls: type) -> dict[str, Kind]:
    """Each field's `Kind` (annotations are strings until resolved)."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: kind_of(hints[f.name]) for f in dataclasses.fields(config_cls)}


@functools.cache
def option_fields(config_cls: type) -> dict[str, dataclasses.Field]:
    """A config's fields by name."""
    return {f.name: f for f in dataclasses.fields(config_cls)}


def option_names(config_cls: type, tag: str | None = None) -> tuple[str, ...]:
    """The option names of a config, or those whose metadata `tag` is set (e.g. 'runtime')."""
    return tuple(
        n for n, f in option_fields(config_cls).items() if tag is None or f.metadata.get(tag)
    )


def default_of(config_cls: type, name: str) -> Any:
    """An option's default (None for a required one)."""
    item = option_fields(config_cls)[name]
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None if item.default is dataclasses.MISSING else item.default


# -- checks -----------------------------------------------------------------------------------


def check_value(config_cls: type, name: str, value: Any) -> Any:
    """`value` for the option `name` of `config_cls`, with lists as tuples; else a TypeError
    (wrong type) or a ValueError (not a choice, out of range, not finite) in one line naming
    the option, what it takes and the value."""
    kind, meta = kinds(config_cls)[name], option_fields(config_cls)[name].metadata
    if not kind.accepts(value):
        raise TypeError(f"{name} must be {kind.describe()}, got {_shown(value)}")
    if isinstance(value, list):
        value = tuple(value)
    if value is None:
        return value
    choices, bounds = meta["choices"], meta["range"]
    if choices is not None:  # of each item of a tuple
        for item in value if isinstance(value, tuple) else (value,):
            check_choice(name, item, choices)
    numbers = [
        v
        for v in (value if isinstance(value, tuple) else (value,))
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        limits = f" {bounds.phrase()}" if bounds else ""
        raise ValueError(f"{name} must be a finite number{limits}, got {value!r}")
    if bounds is not None and not all(bounds.holds(v) for v in numbers):
        raise ValueError(f"{name} {bounds.describe()}, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """A ValueError naming the option and its allowed values when `value` is not one."""
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")


def check_names(config_cls: type, names: Collection[str], what: str, after: str = "") -> None:
    """A TypeError for names that are not options of `config_cls`, each with its closest
    names: "unknown {what} 'lrr' (did you mean lr, blr?){after}"."""
    known = option_names(config_cls)
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = close_names(name, known)
        parts.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise TypeError(f"unknown {what} {', '.join(parts)}{after}")


def close_names(name: str, known: Sequence[str], n: int = 3) -> list[str]:
    """The names of `known` that `name` may be a misspelling of: those it begins (at least 3
    letters given), else the closest by difflib, at most `n`. Every "did you mean" of an
    option, a setting, a flag or a model option comes from here, over its schema's names."""
    longer = [k for k in known if len(name) >= 3 and k.startswith(name)]
    return longer[:n] or difflib.get_close_matches(name, list(known), n=n)


def placeholder(config_cls: type, name: str, *, python: bool = False) -> str:
    """How a hint writes a value of option `name` of `config_cls`: by its type and metadata
    (a pair '(h, w)' in Python, true / false, the metavar, NAME for a choice, N for an
    integer, X for a number), as Python with `python`, else as command-line text."""
    kind, meta = kinds(config_cls)[name], option_fields(config_cls)[name].metadata
    pair = kind.tuple_type
    if python and pair is not None and pair.length == 2:
        return "(h, w)"
    if kind.has(bool):
        return "True / False" if python else "true / false"
    if isinstance(meta["metavar"], str):
        return meta["metavar"]
    if meta["choices"] is not None:
        return "NAME"
    return "N" if kind.has(int) else "X" if kind.has(float) else "VALUE"


def keyword_forms(*schemas: type) -> dict[str, str]:
    """How a hint writes each option of `schemas` as a Python keyword argument ('num_heads=N';
    the first schema that has a name gives it): derived from the schemas, so that a new
    option needs no table of spellings."""
    forms: dict[str, str] = {}
    for schema in schemas:
        for name in option_names(schema):
            forms.setdefault(name, f"{name}={placeholder(schema, name, python=True)}")
    return forms


def from_text(config_cls: type, name: str, value: Any) -> Any:
    """A value written as text (`--model-opt depths=2,2,2,2`) in the type of the option
    `name` of `config_cls`: numbers, true / false / null, and comma-separated lists for a
    tuple; any other value, or text the option takes as it is, unchanged (`check_value` then
    says what the option takes)."""
    kind = kinds(config_cls)[name]
    if not isinstance(value, str) or kind.has(str):
        return value
    text = value.strip()
    if kind.optional and text.lower() in ("null", "none"):
        return None
    inner = text.strip("()[]").strip()
    items = tuple(_scalar(word.strip()) for word in inner.split(",")) if inner else ()
    if len(items) == 1 and kind.accepts(items[0]):
        return items[0]
    return items if kind.tuple_type is not None else value


def _scalar(text: str) -> Any:
    """'2' -> 2, '0.5' -> 0.5, 'true' -> True; other text unchanged."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def check_options(config_cls: type, values: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Some options of `config_cls` by name (e.g. model options before the model is built):
    unknown names and bad values refused as `check_names` and `check_value` do."""
    valid = f"; valid options: {', '.join(option_names(config_cls))}"
    check_names(config_cls, values, what, valid)
    return {name: check_value(config_cls, name, value) for name, value in values.items()}


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__ if value is not None else 'null'})"


def _plain(value: Any) -> Any:
    """JSON-ready: tuples become lists, inside dicts too."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Options:
    """The base of a frozen, keyword-only dataclass of `option()` fields: each value is
    checked (`check_value`) when the config is built; subclasses add their cross-field checks
    in `__post_init__` after `super().__post_init__()`."""

    NOUN: ClassVar[str] = "option"  # how unknown names are reported
    GROUPS: ClassVar[dict[str, str]] = {}  # the --help sections: key -> title, in order

    def __post_init__(self) -> None:
        for name in option_names(type(self)):
            object.__setattr__(self, name, check_value(type(self), name, getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every option (tuples become lists)."""
        return {name: _plain(getattr(self, name)) for name in option_names(type(self))}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Any:
        """Build from a dict such as `to_dict` gives, naming unknown keys and their closest
        valid names."""
        if not isinstance(values, Mapping):
            raise TypeError(f"a {cls.__name__} is built from a dict, got {type(values).__name__}")
        cls._check_names(values)
        return cls(**values)

    def replace(self, **changes: Any) -> Any:
        """A copy with some options changed (unknown names are reported)."""
        self._check_names(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def _check_names(cls, names: Collection[str]) -> None:
        check_names(cls, names, cls.NOUN, f"; valid options: {', '.join(option_names(cls))}")

    @classmethod
    def upgrade_settings(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Settings written by an older release, in today's names (here: unchanged)."""
        return values


# -- settings files ---------------------------------------------------------------------------


def read_settings(
    path: str | os.PathLike,
    config_cls: type[Options],
    *,
    source: str | None = None,
    complete: bool = False,
) -> dict[str, Any]:
    """The checked settings of `config_cls` in a JSON file: a run's `config.json` (its
    "settings") or a flat object of option names.

    Args:
        path: the file.
        config_cls: the config the names and values are checked against.
        source: how errors name the file (default: its path), e.g. '--config run.json'.
        complete: require every setting (a run's own config.json, read on --resume); those
            added later (`since`) get their default.
    """
    source = source or str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SettingsError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"{source}: cannot read it ({err})") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise SettingsError(
            f"{source}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None
    except RecursionError:
        raise SettingsError(f"{source}: nested too deeply to be a settings file") from None
    if isinstance(values, dict) and isinstance(values.get("settings"), dict):
        values = values["settings"]  # the config.json a run wrote
    if not isinstance(values, dict):
        raise SettingsError(f"{source}: expected a JSON object of settings, got {_shown(values)}")
    values = config_cls.upgrade_settings(values)
    try:
        check_names(config_cls, values, "setting(s)", "; the names are the flags' with _ for -")
        values = {name: check_value(config_cls, name, v) for name, v in values.items()}
    except (TypeError, ValueError) as err:
        raise SettingsError(f"{source}: {err}") from None
    if complete:
        optional = option_names(config_cls, "since")
        missing = [n for n in option_names(config_cls) if n not in values and n not in optional]
        if missing:
            raise SettingsError(
                f"{source}: missing setting(s) {', '.join(missing)}; add them, or start the "
                "run again with --overwrite"
            )
    return values
