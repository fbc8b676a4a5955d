"""The model of `eval`, `predict`, `explain` and `summary`: any weights `weights.load_any`
reads, at a precision, its data config overridden by the preparation flags."""

from __future__ import annotations

import argparse
import logging

import torch
from torch import nn

from ..model.precision import set_precision
from ..weights import WeightsInfo, inspect, load_any
from .errors import UserError
from .options import prepared

log = logging.getLogger("vitkit")


def load_model(
    args: argparse.Namespace, device: str, *, classifier: bool = True
) -> tuple[nn.Module, WeightsInfo]:
    """The model of `--checkpoint` (read once: `inspect`, then `load_any`) on `device`, at
    `--precision`, its data config overridden by the preparation flags; with `classifier`,
    weights without a head are refused."""
    info = inspect(args.checkpoint, num_heads=args.num_heads, arch=args.arch)
    if classifier and info.num_classes == 0:
        raise UserError(
            f"{args.checkpoint} is {info.kind} without a classifier head; {args.command} needs "
            f"class scores: fine-tune it first (vitkit train --pretrained {args.checkpoint})"
        )
    model = load_any(info, num_heads=args.num_heads, arch=args.arch, map_location=device)
    model.data_config = prepared(model.data_config, args)
    if classifier and not model.meta.get("class_names"):
        log.warning("%s names no classes; printing class indices", args.checkpoint)
    set_precision(model, getattr(args, "precision", "fp32"))
    return model, info


def class_names(model: torch.nn.Module) -> list[str]:
    """The checkpoint's class names, else the class indices."""
    return model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]
