"""`vitkit explain`: what the model looks at, drawn over the image (relevance, rollout,
class-token attention)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..explain import class_index
from ..files import check_output
from . import options
from .commands import add_command
from .errors import UserError
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "explain",
        description="Draws one PNG of exactly the pixels the model saw (the image resized and "
        "centre-cropped as the checkpoint's data config says; the file with that view boxed "
        "when the crop leaves part of it out) and, blended over them with a colour bar, the "
        "class-specific relevance (gradient-weighted attention, Chefer et al. 2021), the "
        "attention rollout and the last block's class-token attention; for a Swin, whose "
        "windows, shifts and patch merging leave no attention over the whole image, Grad-CAM "
        "on its last stage's map. Prints the predicted "
        "and the explained class and how the view was made from the file.",
    )
    options.checkpoint(p)
    p.add_argument("image", metavar="IMAGE", help="the image file to explain")
    p.add_argument(
        "--output",
        metavar="PNG",
        help="the picture to write (default: <image name>_explain.png in the current folder)",
    )
    p.add_argument("--per-head", action="store_true", help="also a grid of the last block's heads")
    p.add_argument(
        "--head-fusion",
        choices=("mean", "max", "min"),
        default="mean",
        help="how rollout combines heads (default: mean)",
    )
    p.add_argument(
        "--discard-ratio",
        type=options.fraction,
        default=0.0,
        metavar="F",
        help="rollout: zero this fraction of each fused map, lowest first, never the class "
        "token's own attention (default: 0)",
    )
    p.add_argument(
        "--class",
        dest="target",
        metavar="NAME|INDEX",
        help="the class to explain (default: the predicted one)",
    )
    options.model_run(p, precision_flag=False)
    return p


def run(args: argparse.Namespace) -> int:
    output = Path(args.output or f"{Path(args.image).stem}_explain.png")
    check_output(output)  # a FIFO or a folder is refused before the model is read
    predictor = options.load_predictor(args, purpose="explain")
    rollout = args.per_head or args.head_fusion != "mean" or args.discard_ratio
    if predictor.explanation == "gradcam" and rollout:
        raise UserError(
            f"{args.checkpoint} is explained by Grad-CAM on its last stage: --per-head, "
            "--head-fusion and --discard-ratio are the ViT's attention options; drop them"
        )
    names = predictor.class_names
    target = class_index(args.target, names) if args.target is not None else None
    explained = predictor.explain(
        args.image,
        target=target,
        head_fusion=args.head_fusion,
        discard_ratio=args.discard_ratio,
        per_head=args.per_head,
        out=output,
    )
    probs, k, t = explained.probabilities, explained.predicted, explained.target
    drawn = "Grad-CAM" if predictor.explanation == "gradcam" else "attention maps"
    print(
        f"{args.image}: {names[k]} ({float(probs[k]):.4f}); explained class {names[t]} "
        f"({float(probs[t]):.4f}); {explained.caption}; {drawn} in {output}"
    )
    return ExitCode.OK
