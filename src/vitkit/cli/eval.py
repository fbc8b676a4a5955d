"""`vitkit eval`: loss, top-1 / top-5, each class's precision / recall / F1 and a confusion
matrix of a checkpoint on data; a multi-label model's mAP, each class's AP and the F1 of the
labels over its threshold."""

from __future__ import annotations

import argparse
import logging
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn
from torch.utils.data import ConcatDataset

from .. import data as data_lib
from ..files import check_output
from ..plots import plot_confusion, plot_per_class
from ..train import evaluate, evaluate_multi_label, make_loader
from ..weights.checkpoint import RunMeta
from . import options
from .commands import add_command
from .errors import UserError
from .output import json_text, plural, report_skipped
from .progress import progress
from .status import ExitCode

log = logging.getLogger("vitkit")

SPLITS = ("test", "val", "train", "all")
TABLE_ROWS = 20  # classes in the printed table; --json and the picture have every class


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "eval",
        description="Scores a checkpoint on data: loss, top-1 / top-5, each class's precision, "
        "recall and F1, a confusion-matrix and a per-class picture. An unreadable image is "
        "skipped and named on stderr, and the exit status is then 3 (some skipped).",
    )
    options.checkpoint(p)
    p.add_argument(
        "--data",
        metavar="DATA",
        help="data to evaluate: a built-in source or an image folder (default: the data the "
        "checkpoint was trained on)",
    )
    for column, feature in (("image", "Image"), ("label", "ClassLabel")):
        p.add_argument(
            f"--{column}-column",
            metavar="NAME",
            help=f"the {column} column of a Hugging Face dataset (default: its {feature} feature)",
        )
    p.add_argument(
        "--split",
        choices=SPLITS,
        help="score this part of the data, split as in training (the checkpoint's seed and "
        "fractions) (default: a folder's test/ or val/ folder, else all of it; the data the "
        "checkpoint was trained on: the test split training never saw)",
    )
    p.add_argument(
        "--confusion",
        metavar="PNG",
        help="the confusion-matrix picture (default: confusion_<data>_<part>.png in the "
        "checkpoint's run folder, or beside its file)",
    )
    p.add_argument(
        "--per-class",
        metavar="PNG",
        help="the picture of each class's precision, recall and F1 (default: "
        "per_class_<data>_<part>.png in the checkpoint's run folder, or beside its file)",
    )
    options.threshold(p)
    options.batch_size(p, 256)
    options.json_output(p, "one JSON object")
    options.quiet(p)
    options.model_run(p)
    return p


class Pictures(NamedTuple):
    confusion: Path
    per_class: Path


def run(args: argparse.Namespace) -> int:
    predictor = options.load_predictor(args, purpose="eval")
    model, names = predictor.model, predictor.class_names
    spec = args.data or RunMeta.read(model.meta, args.checkpoint).data
    if not spec:
        raise UserError(f"{args.checkpoint} does not record its data; pass --data")
    scored = _evaluation_set(args, spec, model, names)
    pictures = _pictures(args, spec, scored.part)
    for path in pictures:  # a FIFO or a folder is refused before the work
        check_output(path)
    prepared = data_lib.transformed(scored.dataset, predictor.prepare)  # map-style or a stream
    loader = make_loader(prepared, args.batch_size, train=False)
    if predictor.multi_label:
        return _run_multi_label(args, predictor, spec, scored, loader, pictures)
    if args.threshold is not None:
        log.warning("--threshold applies to multi-label models; this one is scored by its top-k")
    show = progress(args.quiet, batch_size=args.batch_size)
    result = evaluate(
        model,
        show(loader, len(loader), "eval"),
        device=predictor.device,
        num_classes=model.num_classes,
    )
    if not math.isfinite(result["loss"]):
        raise FloatingPointError(
            f"the loss of {args.checkpoint} on {scored.description} is {result['loss']}: its "
            "outputs are not finite, so the checkpoint's weights are broken"
        )
    skipped = data_lib.unreadable_files(scored.dataset)
    title = f"{Path(args.checkpoint).name} on {scored.description}"
    plot_confusion(
        result["confusion"], names, pictures.confusion, title=f"{title}: top-1 {result['acc1']:.4f}"
    )
    plot_per_class(result["per_class"], names, pictures.per_class, title=title)
    if args.json:
        row = {
            "checkpoint": args.checkpoint,
            "data": spec,
            "part": scored.part,
            "description": scored.description,
        }
        row.update(_json_scores(result, names, pictures, skipped))
        print(json_text(row))
    else:
        _print_text(scored.description, result, names, pictures)
    report_skipped(skipped, len(scored.dataset))
    return ExitCode.PARTIAL if skipped else ExitCode.OK


def _evaluation_set(
    args: argparse.Namespace, spec: str, model: nn.Module, names: list[str]
) -> data_lib.EvaluationSet:
    """What to score of `spec`: as `data.evaluation_set` chooses, or with `--split` that part
    of it split as in training; data of other classes is refused."""
    meta = RunMeta.read(model.meta, args.checkpoint)
    split = meta.split()
    in_chans = model.data_config.input_size[0]
    columns = meta.columns(spec)
    split = {
        **split,
        "image_column": args.image_column or columns["image_column"],
        "label_column": args.label_column or columns["label_column"],
    }
    if args.split is None:
        scored = data_lib.evaluation_set(
            spec,
            trained_on=meta.data,
            class_names=meta.class_names and names,
            in_chans=in_chans,
            **split,
        )
    else:
        splits = data_lib.load_data(spec, in_chans=in_chans, skip_corrupt=True, **split)
        parts = {"train": splits.train, "val": splits.val, "test": splits.test}
        if args.split == "all":
            dataset = ConcatDataset(list(parts.values()))
            part, described = "all", f"all of {spec} ({plural(len(dataset), 'image')})"
        else:
            dataset, part = parts[args.split], f"{args.split} split"
            count = plural(len(dataset), "image")
            described = f"the {args.split} split of {spec} ({count}, split seed {split['seed']})"
        scored = data_lib.EvaluationSet(dataset, splits.class_names, part, described)
    given = scored.class_names
    if len(given) != model.num_classes or (meta.class_names and given != names):
        raise UserError(
            f"{spec} has {len(given)} classes ({', '.join(given[:5])}...) but {args.checkpoint} "
            f"was trained on {model.num_classes} ({', '.join(names[:5])}...); evaluate it on "
            "data with the same classes"
        )
    return scored


def _pictures(args: argparse.Namespace, spec: str, part: str) -> Pictures:
    """The two pictures: the flags, else beside the weights (in the folder when the checkpoint
    is a run or Hub folder, next to the file otherwise), named by the data and the part scored
    (`confusion_heldout_all.png`), so that evaluations of other data or other parts do not
    overwrite each other."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec).name) or "data"
    suffix = f"{name}_{part.replace(' ', '-')}.png"
    given = Path(args.checkpoint)
    if not given.exists():
        beside = Path()  # a Hub id: the current folder
    else:
        beside = given if given.is_dir() else given.parent
    return Pictures(
        Path(args.confusion) if args.confusion else beside / f"confusion_{suffix}",
        Path(args.per_class) if args.per_class else beside / f"per_class_{suffix}",
    )


def _json_scores(
    result: dict[str, Any], names: list[str], pictures: Pictures, skipped: dict[str, str]
) -> dict[str, Any]:
    """The numbers of `--json`: loss, top-1, top-k, per class, the matrix and the files."""
    scores = result["per_class"]
    per_class = [
        {"class": name, **{key: scores[key][i] for key in ("precision", "recall", "f1", "support")}}
        for i, name in enumerate(names)
    ]
    return {
        **{key: result[key] for key in ("count", "loss", "acc1", "acc5")},
        "topk": min(5, len(names)),
        "per_class": per_class,
        "confusion": result["confusion"].tolist(),
        "confusion_png": str(pictures.confusion),
        "per_class_png": str(pictures.per_class),
        "skipped": skipped,
    }


def _print_text(
    description: str, result: dict[str, Any], names: list[str], pictures: Pictures
) -> None:
    """What was scored, the numbers, a table of the classes (the first `TABLE_ROWS`) and the
    pictures."""
    top = min(5, len(names))  # `evaluate`'s top-5 is a top-k of at most the classes
    print(f"scored {description}")
    print(
        f"{plural(result['count'], 'image')}  loss {result['loss']:.4f}  "
        f"top-1 {result['acc1']:.4f}  top-{top} {result['acc5']:.4f}"
    )
    scores = result["per_class"]
    columns = {"precision": scores["precision"], "recall": scores["recall"], "F1": scores["f1"]}
    _print_classes(names, columns, scores["support"])
    if len(names) > TABLE_ROWS:
        print(
            f"(the first {TABLE_ROWS} of {len(names)} classes; --json and the per-class "
            "picture have all)"
        )
    print(f"confusion matrix: {pictures.confusion}")
    print(f"per-class scores: {pictures.per_class}")


def _run_multi_label(
    args: argparse.Namespace,
    predictor: Any,
    spec: str,
    scored: data_lib.EvaluationSet,
    loader: Any,
    pictures: Pictures,
) -> int:
    """A multi-label model's scores: mAP, each class's AP, precision, recall and F1 at the
    threshold, and the per-class picture (no confusion matrix: an image has several labels)."""
    names = predictor.class_names
    threshold = args.threshold if args.threshold is not None else predictor.threshold
    result = evaluate_multi_label(
        predictor.model, loader, device=predictor.device, threshold=threshold
    )
    skipped = data_lib.unreadable_files(scored.dataset)
    title = f"{Path(args.checkpoint).name} on {scored.description}: mAP {result['map']:.4f}"
    plot_per_class(result["per_class"], names, pictures.per_class, title=title)
    if args.json:
        scores = result["per_class"]
        per_class = [
            {
                "class": name,
                "ap": result["ap"][i],
                **{key: scores[key][i] for key in ("precision", "recall", "f1", "support")},
            }
            for i, name in enumerate(names)
        ]
        row = {
            "checkpoint": args.checkpoint,
            "data": spec,
            "part": scored.part,
            "description": scored.description,
        }
        keys = ("count", "loss", "map", "f1", "macro_f1", "threshold")
        row.update({key: result[key] for key in keys})
        row.update(per_class=per_class, per_class_png=str(pictures.per_class), skipped=skipped)
        print(json_text(row))
    else:
        _print_multi_label(scored.description, result, names, pictures)
    report_skipped(skipped, len(scored.dataset))
    return ExitCode.PARTIAL if skipped else ExitCode.OK


def _print_multi_label(
    description: str, result: dict[str, Any], names: list[str], pictures: Pictures
) -> None:
    """What was scored, mAP and F1, and a table of the classes (the first `TABLE_ROWS`)."""
    print(f"scored {description}")
    print(
        f"{plural(result['count'], 'image')}  loss {result['loss']:.4f}  mAP {result['map']:.4f}  "
        f"F1 {result['f1']:.4f} (macro {result['macro_f1']:.4f}) at threshold {result['threshold']}"
    )
    scores = result["per_class"]
    columns = {"AP": result["ap"], "precision": scores["precision"], "recall": scores["recall"]}
    _print_classes(names, {**columns, "F1": scores["f1"]}, scores["support"])
    if len(names) > TABLE_ROWS:
        print(f"(the first {TABLE_ROWS} of {len(names)} classes; --json has all)")
    print(f"per-class scores: {pictures.per_class}")


def _print_classes(names: list[str], columns: dict[str, list[float]], support: list[int]) -> None:
    """A table of the first `TABLE_ROWS` classes: their name, each column's score (4 decimals)
    and their support."""
    width = min(max(len("class"), *(len(n) for n in names[:TABLE_ROWS])), 30)
    widths = [max(len(title), 6) for title in columns]
    header = [f"{'class':<{width}}", *(t.ljust(w) for t, w in zip(columns, widths)), "support"]
    print("  ".join(header))
    for i, name in enumerate(names[:TABLE_ROWS]):
        cells = [f"{values[i]:.4f}".ljust(w) for values, w in zip(columns.values(), widths)]
        print("  ".join([f"{name[:width]:<{width}}", *cells, str(support[i])]))
