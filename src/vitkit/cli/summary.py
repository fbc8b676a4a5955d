"""`vitkit summary`: a model's layers, shapes, parameters and FLOPs, or its forward pass stage
by stage (`--flow`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from ..model import VisionTransformer, registry
from ..train.config import TrainConfig
from ..weights import load_any
from . import options
from .commands import add_command
from .errors import UserError
from .options import add_train_options, int_in, train_options_given
from .status import ExitCode

# train's flags that `summary` takes, with the help they have there (None: train's).
_MODEL_FIELDS = {
    "model_opts": None,
    "img_size": "input size: N or H W (default: the model's)",
    "in_chans": "channels",
}


OPTION_FLAGS = options.WEIGHTS_FLAGS
WEIGHTS_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "summary",
        description="The table lists every module; --flow walks the forward pass, one line per "
        "stage with its measured output shape. The model options are those of `vitkit train`.",
    )
    p.add_argument(
        "model",
        help="a registered model name (see `vitkit models`), or weights: a vitkit checkpoint, "
        "or timm / Hugging Face / torchvision / JAX weights, a file or a model folder",
    )
    g = add_train_options(p, only=_MODEL_FIELDS, title="model options (as vitkit train)")
    g.add_argument(
        "--patch-size",
        type=int_in(1),
        nargs="+",
        metavar="N",
        help="patch size: N or H W (as --model-opt patch_size=N)",
    )
    g.add_argument("--num-classes", type=int_in(0), help="head outputs (default: the preset's)")
    options.batch_size(p, 1)
    p.add_argument(
        "--depth",
        type=options.int_in(0),
        default=2,
        metavar="N",
        help="deepest module level listed (default: 2)",
    )
    p.add_argument(
        "--flow",
        action="store_true",
        help="the forward pass stage by stage: operation, layout, measured shape, parameters",
    )
    p.add_argument(
        "--all-blocks",
        action="store_true",
        help="with --flow, every block (default: blocks that repeat block 0 on one line)",
    )
    p.add_argument(
        "--compare-torch",
        action="store_true",
        help="parameters per stage of the native encoder and the nn.TransformerEncoder one",
    )
    options.weights_reading(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..summary import compare_params, flow, summary

    model = _model(args)
    size = (args.batch_size, *model.data_config.input_size)
    if not (args.flow or args.compare_torch):
        print(summary(model, size, max_depth=args.depth))
        return ExitCode.OK
    if not isinstance(model, VisionTransformer):
        raise UserError(f"{args.model} is a timm CNN: --flow and --compare-torch walk ViTs")
    native = flow(model, size)
    if args.flow:
        print(native.render(all_blocks=args.all_blocks))
    if args.compare_torch:
        twin = _model(args, encoder="torch" if native.encoder == "native" else "native")
        other = flow(twin, size)
        if args.flow:
            print(other.render(all_blocks=args.all_blocks))
        pair = (native, other) if native.encoder == "native" else (other, native)
        print(compare_params(*pair))
    return ExitCode.OK


def _is_weights(name: str) -> bool:
    """True when `summary`'s argument names weights (a path) rather than a registered model."""
    path = Path(name)
    return path.exists() or "/" in name or path.suffix in WEIGHTS_SUFFIXES


def _weights_model(args: argparse.Namespace, encoder: str | None) -> nn.Module:
    """The model of the weights `args.model` (any `load_any` reads), or with `encoder` a
    model of their config with that encoder (for its parameter counts)."""
    given = [
        flag
        for flag, value in (("--patch-size", args.patch_size), ("--num-classes", args.num_classes))
        if value is not None
    ]
    given += [options.train_flag(name) for name in _model_options(args)]
    if given:
        raise UserError(
            f"{args.model} brings its own architecture, so {', '.join(given)} cannot apply: "
            f"drop {'it' if len(given) == 1 else 'them'}"
        )
    model = load_any(args.model, num_heads=args.num_heads, arch=args.arch)
    if encoder is not None:
        model = VisionTransformer(model.config.replace(encoder=encoder, drop_path_rate=0.0))
    return model


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainConfig` model options (`_MODEL_FIELDS`) the command line set."""
    return {k: v for k, v in train_options_given(args).items() if k in _MODEL_FIELDS}


def _model(args: argparse.Namespace, encoder: str | None = None) -> nn.Module:
    """The model of the weights `args.model` names, else the model `vitkit train` would build
    from these options (the same `TrainConfig` checks and `build_model`), for data with the
    preset's channels and classes."""
    if _is_weights(args.model):
        return _weights_model(args, encoder)
    if args.arch is not None or args.num_heads is not None:
        raise UserError(
            f"--arch and --num-heads read weights; {args.model} is a registered model: set its "
            "options with --model-opt (e.g. num_heads=N)"
        )
    from ..data import Splits
    from ..train.setup import build_model

    given = _model_options(args)
    options = dict(given.pop("model_opts", {}))
    for flag, key, value in (
        ("--patch-size", "patch_size", args.patch_size),
        ("--num-classes", "num_classes", args.num_classes),
    ):
        if value is None:
            continue
        if key in options:
            raise UserError(f"{flag} and --model-opt {key}=... both set {key}; give it once")
        options[key] = tuple(value) if isinstance(value, list) else value
    if isinstance(options.get("patch_size"), tuple) and len(options["patch_size"]) == 1:
        options["patch_size"] = options["patch_size"][0]
    if encoder is not None:
        options["encoder"] = encoder
    # No stochastic depth: train's default rate is a training choice, not a shape.
    config = TrainConfig(model=args.model, model_opts=options, drop_path=0.0, **given)
    base = registry.get_config(args.model)
    chans = config.in_chans or base.in_chans
    shape_only = Splits(
        train=[], val=[], test=[],
        class_names=[str(i) for i in range(base.num_classes)],
        in_chans=chans, img_size=None, mean=(0.5,) * chans, std=(0.5,) * chans,
    )  # fmt: skip
    return build_model(config, shape_only)
