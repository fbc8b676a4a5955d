"""Parity of converted weights with the source library's own model, run beside the vitkit model
on the same random batch (`vitkit convert`'s parity line).

A check is only as good as its reference. Built from vitkit's own inferred config, the source
library's generic model proves the key mapping, not the function: what the weights do not
record (the activation, the norm epsilon, the block order, the head count, the pooling) is
assumed on both sides alike. So the reference is the model the source itself describes where
one can be built: timm's model of its name (`arch=`, a timm folder's `architecture`, a vitkit
checkpoint's `model_name`, a timm training checkpoint's `arch` or `pretrained_cfg`), built by
`timm.create_model` and loaded strictly; transformers' model of the folder's (or the given)
`config.json`, read by its own `from_pretrained`; torchvision's builder of the weights' sizes
(`vit_b_16` ...); for JAX `.npz` files, timm's model of the name with the file read by timm's
own npz loader. Where none can be built, the check is said to be of the key mapping only, and
what was assumed is named (`Parity.line`), never reported as "ok".
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model import architecture_of, get_config, list_models
from .checkpoint import (
    CONFIG_KEY,
    META_KEY,
    CheckpointError,
    is_npz_file,
    is_safetensors_file,
    load_state_dict,
    safetensors_header,
    saved_config,
    strip_prefix,
)
from .families import family_named, weights_family
from .hub import hf_config_dict
from .info import inspect
from .reference import (
    ACTIVATIONS,
    PARITY_TOLERANCE,
    Outputs,
    Parity,
    created,
    folder_model_args,
    hf_class,
    hf_outputs,
    hf_pretrained,
    not_installed,
    quiet_transformers,
    run,
    strict_load,
    timm_outputs,
)

# The formats a check is of.
_SOURCES = ("timm", "hf", "torchvision", "jax")


def check_parity(
    model: nn.Module,
    source: str | os.PathLike,
    format: str,
    *,
    arch: str | None = None,
    num_heads: int | None = None,
    hf_config: Any = None,
    tolerance: float = PARITY_TOLERANCE,
) -> Parity:
    """`model` (converted from `source`) beside the source library's own model of `source`.

    Args:
        model: the converted vitkit model.
        source: the weights file or folder it was converted from.
        format: 'timm', 'hf', 'torchvision' or 'jax'.
        arch, num_heads, hf_config: the reading options the conversion was given (`arch`: a
            timm model name, or for torchvision a builder name such as 'vit_b_16').
        tolerance: the largest |difference| accepted.
    """
    if format not in _SOURCES:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(_SOURCES)}")
    given = {"arch": arch, "num_heads": num_heads, "hf_config": hf_config}
    given = {k: v for k, v in given.items() if v is not None}
    family = weights_family(model.config)
    check = family.parity.get(format) or _GENERIC.get(format)
    if check is None:
        return Parity(note=f"vitkit reads no {format} weights of this model's family")
    return dataclasses.replace(check(model, Path(source), given), tolerance=tolerance)


def reading_options(
    source: str | os.PathLike, format: str, *, arch: str | None = None, num_heads: int | None = None
) -> dict[str, Any]:
    """`load_pretrained`'s `arch` and `num_heads` for `source`: a torchvision builder name
    stands for what its family says (`arch='vit_b_16'`: its head count); without `arch`, a
    timm name the file records (`recorded_name`) that vitkit knows names the architecture."""
    builder = family_named(arch).builders.get(arch) if format == "torchvision" else None
    if builder is not None:
        given = {"num_heads": num_heads} if num_heads is not None else {}
        return {**builder, **given}
    if arch is None and format == "timm":
        name = recorded_name(source)
        arch = name if name in list_models() else None
    return {k: v for k, v in {"arch": arch, "num_heads": num_heads}.items() if v is not None}


# -- what a source names of itself ----------------------------------------------------------


def recorded_name(source: str | os.PathLike) -> str | None:
    """The timm model name a file or folder records: a timm folder's `architecture`, the
    `model_name` of a vitkit checkpoint whose config has that name's options, or a timm
    training checkpoint's `arch` (or `pretrained_cfg['architecture']`); None if none."""
    path = Path(source)
    if path.is_dir():
        config = path / "config.json"
        try:
            values = json.loads(config.read_text()) if config.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None
        name = values.get("architecture") if isinstance(values, dict) else None
        return name if isinstance(name, str) else None
    try:
        if path.suffix == ".npz" or is_npz_file(path):
            return None
        if path.suffix == ".safetensors" or is_safetensors_file(path):
            return _vitkit_name(path, safetensors_header(path)[0])
        return _pickled_name(path)
    except (CheckpointError, OSError):
        return None


def _vitkit_name(path: Path, metadata: Mapping[str, str]) -> str | None:
    try:
        meta = json.loads(metadata.get(META_KEY, "{}"))
    except (json.JSONDecodeError, RecursionError):
        return None
    name = meta.get("model_name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or CONFIG_KEY not in metadata:
        return None
    if name in list_models():  # the model options may have changed what the name computes
        saved, named = saved_config(metadata, path), get_config(name)
        fields = weights_family(saved).name_fields
        if any(getattr(saved, f) != getattr(named, f) for f in fields):
            return None
    return name


def _pickled_name(path: Path) -> str | None:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # the conversion read it already; a name is optional
        return None
    if not isinstance(obj, dict):
        return None
    cfg = obj.get("pretrained_cfg")
    name = cfg.get("architecture") if isinstance(cfg, dict) else obj.get("arch")
    return name if isinstance(name, str) else None


# -- timm -------------------------------------------------------------------------------------


def _timm_parity(model: nn.Module, path: Path, given: dict[str, Any]) -> Parity:
    name = given.get("arch") or recorded_name(path)
    info = inspect(path, format="timm")
    stated = {**info.source_options, **given}  # a timm folder's model_args, the options given
    family = weights_family(model.config)
    assumed = () if name else family.timm_assumed(model.config, stated)
    fields = {"assumed": assumed, "fix": ("arch", "to check against timm") if assumed else None}
    weights = strip_prefix(load_state_dict(info.weights_file), "module.")
    weights = family.native_keys(weights)  # e.g. a vitkit ViT's encoder='torch' keys
    try:
        import timm
    except ImportError:
        return not_installed("timm", name and f"timm {name}", **fields)
    if name and timm.is_model(name):
        kwargs = {**folder_model_args(path), **family.timm_sizes(model.config)}
        reference = created(name, kwargs)

        def build() -> Outputs:
            named = timm.create_model(name, pretrained=False, **kwargs)
            strict_load(named, weights)
            return timm_outputs(named)

        return run(model, build, reference=reference, scope="function", **fields)
    if name:
        fields["note"] = f"timm {timm.__version__} does not know {name}"
    if family.reference_model is None:
        return Parity(note=fields.pop("note", None) or "timm has no generic model of it", **fields)
    return run(
        model,
        lambda: timm_outputs(family.reference_model("timm", model.config, weights)),
        reference=family.timm_reference,
        scope="mapping",
        **fields,
    )


# -- Hugging Face -----------------------------------------------------------------------------


def _hf_parity(model: nn.Module, path: Path, given: dict[str, Any]) -> Parity:
    info = inspect(path, format="hf")
    stated = given.get("hf_config") or info.source_options.get("config")
    config = model.config
    fields: dict[str, Any] = {}
    if stated is None:
        act = ACTIVATIONS.get(config.act_layer, config.act_layer)
        assumed = [
            f"the activation ({act} assumed)",
            f"the norm epsilon ({config.norm_eps:g} assumed)",
        ]
        if "num_heads" not in given:
            assumed.append(f"the head count ({config.num_heads} assumed)")
        fields = {"assumed": tuple(assumed), "fix": ("hf_config", "to check against transformers")}
    try:
        import transformers
    except ImportError:
        return not_installed("transformers", None, **fields)
    weights = load_state_dict(info.weights_file)
    with quiet_transformers(transformers):
        reference_model = weights_family(config).reference_model
        if stated is None and reference_model is None:  # transformers' model needs a config
            title = architecture_of(config).title
            return Parity(note=f"transformers' {title} is built from its config.json", **fields)
        if stated is None:
            inner = reference_model("hf", config, weights).inner
            return run(
                model,
                lambda: hf_outputs(inner),
                reference=f"transformers' {type(inner).__name__}",
                scope="mapping",
                **fields,
            )
        hub = hf_config_dict(stated)
        name = hf_class(hub, transformers)
        folder = path if path.is_dir() and "hf_config" not in given else None
        return run(
            model,
            lambda: hf_outputs(hf_pretrained(transformers, name, hub, folder, weights)),
            reference=f"transformers {name}",
            scope="function",
        )


# The checks of the formats whose reference every family shares (a family's own come first).
_GENERIC = {"timm": _timm_parity, "hf": _hf_parity}
