"""`vitkit predict`: the top classes and their probabilities for each image."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..train import predict
from ..train.config import resolve_device
from . import options
from .commands import add_command
from .loading import class_names, load_model, model_inputs
from .output import json_text, plural
from .status import ExitCode

log = logging.getLogger("vitkit")

BATCH = 64  # images per forward pass


OPTION_FLAGS = options.WEIGHTS_FLAGS


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "predict")
    options.checkpoint(p)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files to classify")
    p.add_argument(
        "--topk",
        type=options.int_in(1),
        metavar="K",
        help="how many classes to list per image, most probable first (default: 5, or the "
        "checkpoint's classes when it has fewer)",
    )
    options.json_output(p, "a JSON list")
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model, _ = load_model(args, device)
    names = class_names(model)
    topk = _topk(args.topk, len(names))
    rows = []
    for start in range(0, len(args.images), BATCH):
        paths = args.images[start : start + BATCH]
        batch = model_inputs(model, paths).to(device)
        probs, indices = predict(model, batch, topk=topk)
        for path, p, ix in zip(paths, probs.tolist(), indices.tolist()):
            rows.append(
                {
                    "image": path,
                    "predictions": [
                        {"class": names[i], "index": i, "probability": round(q, 6)}
                        for q, i in zip(p, ix)
                    ],
                }
            )
    if args.json:
        print(json_text(rows))
        return ExitCode.OK
    for row in rows:
        best = row["predictions"][0]
        print(f"{row['image']}: {best['class']} ({best['probability']:.4f})")
        for pred in row["predictions"][1:]:
            print(f"    {pred['class']} ({pred['probability']:.4f})")
    return ExitCode.OK


def _topk(asked: int | None, classes: int) -> int:
    """`--topk`, at most the number of classes (said once when it asked for more)."""
    if asked is None:
        return min(5, classes)
    if asked > classes:
        log.warning("--topk %d: the checkpoint has %s; listing all of them", asked,
                    plural(classes, "class", "classes"))  # fmt: skip
        return classes
    return asked
