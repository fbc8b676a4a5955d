"""`vitkit eval`: loss, top-1 / top-5 and a confusion matrix of a checkpoint on data."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import ConcatDataset, Dataset

from .. import data as data_lib
from ..plots import plot_confusion
from ..train import evaluate, make_loader
from ..train.config import resolve_device
from . import options
from .commands import add_command
from .errors import UserError
from .loading import class_names, load_model
from .output import json_text, plural
from .status import ExitCode

OPTION_FLAGS = options.WEIGHTS_FLAGS


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "eval")
    options.checkpoint(p)
    p.add_argument(
        "--data",
        metavar="DATA",
        help="data to evaluate: a built-in source or an image folder (default: the data the "
        "checkpoint was trained on)",
    )
    p.add_argument(
        "--split",
        choices=("test", "val", "train", "all"),
        default="test",
        help="which part of the data, split as in training (default: test)",
    )
    p.add_argument(
        "--confusion",
        metavar="PNG",
        help="confusion matrix picture (default: beside the checkpoint)",
    )
    options.batch_size(p, 256)
    options.json_output(p, "one JSON object")
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model, _ = load_model(args, device)
    names = class_names(model)
    spec, dataset = _dataset(args, model, names)
    prepared = data_lib.Transformed(dataset, data_lib.eval_transform(model.data_config))
    loader = make_loader(prepared, args.batch_size, train=False)
    result = evaluate(model, loader, device=device, num_classes=model.num_classes)
    if not math.isfinite(result["loss"]):
        raise FloatingPointError(
            f"the loss of {args.checkpoint} on {args.split} is {result['loss']}: its outputs are "
            "not finite, so the checkpoint's weights are broken"
        )
    confusion_path = (
        Path(args.confusion)
        if args.confusion
        else (Path(args.checkpoint).parent / f"confusion_{args.split}.png")
    )
    plot_confusion(
        result["confusion"],
        names,
        confusion_path,
        title=f"{Path(args.checkpoint).name} on {args.split}: top-1 {result['acc1']:.4f}",
    )
    if args.json:
        row = {"checkpoint": args.checkpoint, "data": spec, "split": args.split}
        row.update({key: result[key] for key in ("count", "loss", "acc1", "acc5")})
        row.update(confusion=result["confusion"].tolist(), confusion_png=str(confusion_path))
        print(json_text(row))
        return ExitCode.OK
    top = min(5, len(names))  # `evaluate`'s top-5 is a top-k of at most the classes
    print(
        f"{args.split}: {plural(result['count'], 'image')}  loss {result['loss']:.4f}  "
        f"top-1 {result['acc1']:.4f}  top-{top} {result['acc5']:.4f}"
    )
    print(f"confusion matrix: {confusion_path}")
    return ExitCode.OK


def _dataset(
    args: argparse.Namespace, model: torch.nn.Module, names: list[str]
) -> tuple[str, Dataset]:
    """(data spec, the split to score): `--data`, else the checkpoint's own data, split as in
    training; data of other classes is refused."""
    meta = model.meta
    spec = args.data or meta.get("data")
    if not spec:
        raise UserError(f"{args.checkpoint} does not record its data; pass --data")
    prepared = model.data_config
    splits = data_lib.load_data(
        spec,
        val_fraction=meta.get("val_fraction", 0.1),
        test_fraction=meta.get("test_fraction", 0.2),
        seed=meta.get("split_seed", 0),
        in_chans=prepared.input_size[0],
        img_size=prepared.img_size,
        skip_corrupt=False,
    )
    if splits.num_classes != model.num_classes or (
        meta.get("class_names") and splits.class_names != names
    ):
        raise UserError(
            f"{spec} has {splits.num_classes} classes ({', '.join(splits.class_names[:5])}...) "
            f"but {args.checkpoint} was trained on {model.num_classes} "
            f"({', '.join(names[:5])}...); evaluate it on data with the same classes"
        )
    if args.split == "all":
        return spec, ConcatDataset([splits.train, splits.val, splits.test])
    return spec, getattr(splits, args.split)
