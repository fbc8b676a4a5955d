"""The settings of a training run as a JSON file, checked before any work starts.

`vitkit train` records them in the run's `config.json` (its "settings" object);
`vitkit train --config FILE` reads such a file, or a flat object of the same names, and
`--resume` reads the run's own. A hand-edited file with a misspelt name, a value of the wrong
type or broken JSON is refused with one line that names the key, instead of failing later
somewhere inside training.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

# The JSON types of each setting (`None`: the value may be null); list items in `_ITEMS`.
TYPES: dict[str, tuple[type | None, ...]] = {
    "data": (str,),
    "model": (str,),
    "model_opts": (dict,),
    "img_size": (list, None),
    "in_chans": (int, None),
    "val_fraction": (float,),
    "test_fraction": (float,),
    "seed": (int,),
    "amp": (str, None),
    "compile": (bool,),
    "ema": (float, None),
    "pretrained": (str, None),
    "teacher": (str, None),
    "distill": (str,),
    "distill_alpha": (float,),
    "distill_tau": (float,),
    "lr": (float, None),
    "epochs": (int,),
    "batch_size": (int,),
    "blr": (float,),
    "min_lr": (float,),
    "warmup_epochs": (float,),
    "weight_decay": (float,),
    "clip_grad": (float, None),
    "accum_steps": (int,),
    "smoothing": (float,),
    "mixup": (float,),
    "cutmix": (float,),
    "mix_prob": (float,),
    "aa": (str,),
    "crop_scale": (list, None),
    "hflip": (float,),
    "reprob": (float,),
    "drop_path": (float,),
    "threads": (int, None),
    "save_every": (int,),
}
_ITEMS: dict[str, type] = {"img_size": int, "crop_scale": float}
_PLURALS = {int: "integers", float: "numbers"}
# Settings that the config.json of an older run may lack, with the value they had then.
OPTIONAL: dict[str, Any] = {"save_every": 0}
_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    None: "null",
}


class SettingsError(ValueError):
    """A settings file that cannot be used: names the file, the key and what was wrong."""


def read_settings(
    path: str | os.PathLike, *, source: str | None = None, complete: bool = False
) -> dict[str, Any]:
    """The checked settings in a JSON file: a run's `config.json` or a flat object.

    Args:
        path: the file.
        source: how errors name the file (default: its path), e.g. '--config run.json'.
        complete: require every setting (a run's own config.json, read on --resume); the
            missing optional ones get their old default.
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
    if isinstance(values, dict) and isinstance(values.get("settings"), dict):
        values = values["settings"]  # the config.json a run wrote
    if not isinstance(values, dict):
        raise SettingsError(
            f"{source}: expected a JSON object of settings, got {_describe(values)}"
        )
    check_settings(values, source)
    if complete:
        missing = sorted(set(TYPES) - set(values) - set(OPTIONAL))
        if missing:
            raise SettingsError(
                f"{source}: missing setting(s) {', '.join(missing)}; add them, or start the "
                "run again with --overwrite"
            )
        values = {**OPTIONAL, **values}
    return values


def check_settings(values: dict[str, Any], source: str) -> None:
    """Raise `SettingsError` for unknown names (with the close ones) and mistyped values."""
    unknown = [key for key in values if key not in TYPES]
    if unknown:
        parts = []
        for key in unknown:
            longer = [name for name in TYPES if len(key) >= 3 and name.startswith(key)]
            close = longer[:1] or difflib.get_close_matches(key, TYPES, n=1)
            parts.append(f'"{key}"' + (f' (did you mean "{close[0]}"?)' if close else ""))
        raise SettingsError(
            f"{source}: unknown setting(s) {', '.join(parts)}; "
            "the names are those of `vitkit train --help` with _ for -"
        )
    for key, value in values.items():
        if not _has_type(value, TYPES[key]) or (
            isinstance(value, list) and not all(_has_type(v, (_ITEMS[key],)) for v in value)
        ):
            expected = " or ".join(_NAMES[t] for t in TYPES[key])
            if key in _ITEMS:
                expected = expected.replace("a list", f"a list of {_PLURALS[_ITEMS[key]]}")
            raise SettingsError(f'{source}: "{key}" must be {expected}, got {_describe(value)}')


def _has_type(value: Any, types: tuple[type | None, ...]) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):  # JSON true is no number
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return any(t is not None and isinstance(value, t) for t in types)


def _describe(value: Any) -> str:
    text = json.dumps(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__ if value is not None else 'null'})"
