"""CNN classifiers from timm (`--model timm:resnet18`), trained, saved and loaded like vitkit's
ViTs, so that the small-data recipe of DeiT and the ViT tutorials (train a ResNet, distil it
into a ViT) is two `vitkit train` commands.

A checkpoint of one is safetensors with `vitkit_timm` metadata (the timm name, classes and
channels) instead of a ViT config; `vitkit.load` rebuilds it through timm (the `interop`
extra), after checking the file's tensor shapes against the model's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

PREFIX = "timm:"
TIMM_KEY = "vitkit_timm"


def is_timm_name(name: str | None) -> bool:
    """True for `timm:NAME` model names."""
    return bool(name) and name.startswith(PREFIX)


def create_timm_classifier(
    name: str, *, num_classes: int, in_chans: int, **options: Any
) -> nn.Module:
    """`timm.create_model(NAME, pretrained=False, ...)` for `timm:NAME`, marked so that
    `vitkit.save` can record how to rebuild it."""
    import timm  # the interop extra (missing: one line naming it)

    timm_name = name.removeprefix(PREFIX)
    try:
        model = timm.create_model(
            timm_name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **options
        )
    except RuntimeError as err:  # timm: "Unknown model (...)"
        raise ValueError(f"timm has no model {timm_name!r} ({err})") from None
    except TypeError as err:
        raise ValueError(f"timm:{timm_name} does not take these options ({err})") from None
    model.vitkit_timm = {"name": timm_name, "num_classes": num_classes, "in_chans": in_chans}
    return model


def timm_metadata(model: nn.Module) -> str | None:
    """The `vitkit_timm` metadata of a model made by `create_timm_classifier`, else None."""
    spec = getattr(model, "vitkit_timm", None)
    return json.dumps(spec) if spec else None


def parse_spec(metadata: str, source: str) -> dict[str, Any]:
    """The name, classes and channels a `vitkit_timm` metadata entry records (checked)."""
    try:
        spec = json.loads(metadata)
        name, classes, chans = spec["name"], spec["num_classes"], spec["in_chans"]
    except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as err:
        raise ValueError(f"{source} has invalid vitkit_timm metadata ({err})") from None
    if not (isinstance(name, str) and isinstance(classes, int) and isinstance(chans, int)):
        raise ValueError(f"{source} has invalid vitkit_timm metadata: {spec!r}")
    return {"name": name, "num_classes": classes, "in_chans": chans}


def rebuild(spec: Mapping[str, Any], *, meta_device: bool = False) -> nn.Module:
    """The timm CNN `spec` describes (`parse_spec`, or a timm folder's architecture, classes,
    channels and `model_args`), with random weights; on the meta device, shapes only."""
    options = dict(spec.get("model_args") or {})
    with torch.device("meta") if meta_device else contextlib.nullcontext():
        return create_timm_classifier(
            PREFIX + spec["name"],
            num_classes=spec["num_classes"],
            in_chans=spec["in_chans"],
            **options,
        )
