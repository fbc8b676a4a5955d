"""`vitkit predict`: the top classes and their probabilities for each image; a multi-label
model's labels over its threshold."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from .. import data as data_lib
from . import options
from .commands import add_command
from .output import json_text, plural, report_skipped
from .progress import progress
from .status import ExitCode

log = logging.getLogger("vitkit")

BATCH = 64  # images per forward pass


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "predict",
        description="Prints each image's most probable classes (a multi-label model's: the "
        "classes whose probability reaches the threshold). An unreadable image is skipped "
        "and named on stderr, and the exit status is then 3 (some skipped); when none can be "
        "read, the command fails with exit status 2.",
    )
    options.checkpoint(p)
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files, folders (searched recursively) or glob patterns such as "
        "'photos/**/*.jpg'",
    )
    p.add_argument(
        "--topk",
        type=options.int_in(1),
        metavar="K",
        help="how many classes to list per image, most probable first (default: 5, or the "
        "checkpoint's classes when it has fewer)",
    )
    options.threshold(p)
    options.json_output(
        p,
        "a JSON list, one object per image ({image, predictions}, a multi-label model's "
        "{image, labels, threshold}, or {image, skipped})",
    )
    options.quiet(p)
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    paths = data_lib.find_images(args.images)  # a missing input is a usage error, at once
    predictor = options.load_predictor(args, purpose="predict")
    names = predictor.class_names
    _unused_flags(args, predictor.multi_label)
    topk = _topk(args.topk, len(names))
    rows: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    starts = range(0, len(paths), BATCH)
    show = progress(args.quiet, batch_size=BATCH)
    for start in show(starts, len(starts), "predict"):
        loaded = data_lib.load_images(
            paths[start : start + BATCH], predictor.prepare, in_chans=predictor.in_chans
        )
        skipped.update(loaded.skipped)
        rows.update({path: {"image": path, "skipped": why} for path, why in loaded.skipped.items()})
        if not loaded.paths:
            continue
        if predictor.multi_label:
            rows.update(_labels(predictor, loaded, args.threshold))
            continue
        probs, indices = predictor.predict(loaded.images, topk)
        for path, p, ix in zip(loaded.paths, probs.tolist(), indices.tolist()):
            predictions = [
                {"class": names[i], "index": i, "probability": round(q, 6)} for q, i in zip(p, ix)
            ]
            rows[path] = {"image": path, "predictions": predictions}
    if len(skipped) == len(paths):
        raise data_lib.DataError(data_lib.none_readable(skipped))
    ordered = [rows[str(path)] for path in paths]
    if args.json:
        print(json_text(ordered))
    elif predictor.multi_label:
        _print_labels(ordered)
    else:
        for row in ordered:
            if "predictions" not in row:
                continue
            best, *others = row["predictions"]
            print(f"{row['image']}: {best['class']} ({best['probability']:.4f})")
            for pred in others:
                print(f"    {pred['class']} ({pred['probability']:.4f})")
    report_skipped(skipped, len(paths))
    return ExitCode.PARTIAL if skipped else ExitCode.OK


def _topk(asked: int | None, classes: int) -> int:
    """`--topk`, at most the number of classes (said once when it asked for more)."""
    if asked is None:
        return min(5, classes)
    if asked > classes:
        log.warning(
            "--topk %d: the checkpoint has %s; listing all of them",
            asked,
            plural(classes, "class", "classes"),
        )
        return classes
    return asked


def _labels(predictor: Any, loaded: Any, threshold: float | None) -> dict[str, dict[str, Any]]:
    """A multi-label model's rows: each image's classes at or over the threshold."""
    names, at = predictor.class_names, threshold if threshold is not None else predictor.threshold
    rows = {}
    for path, found in zip(loaded.paths, predictor.labels(loaded.images, at)):
        labels = [{"class": names[i], "index": i, "probability": round(q, 6)} for q, i in found]
        rows[path] = {"image": path, "labels": labels, "threshold": at}
    return rows


def _print_labels(rows: list[dict[str, Any]]) -> None:
    """'photo.png: cat (0.9120), dog (0.6034)', or that no class reached the threshold."""
    for row in rows:
        if "labels" not in row:
            continue
        shown = ", ".join(f"{lb['class']} ({lb['probability']:.4f})" for lb in row["labels"])
        print(f"{row['image']}: {shown or 'no class reaches ' + str(row['threshold'])}")


def _unused_flags(args: argparse.Namespace, multi_label: bool) -> None:
    """Say so once when a flag does not apply to the model: --topk to a multi-label one (its
    labels are those over the threshold), --threshold to a single-label one."""
    if multi_label and args.topk is not None:
        log.warning("--topk: a multi-label model lists the labels over its threshold (--threshold)")
    if not multi_label and args.threshold is not None:
        log.warning("--threshold applies to multi-label models; this one lists its top-k")
