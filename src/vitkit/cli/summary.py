"""`vitkit summary`: a model's layers, shapes, parameters and FLOPs, or its forward pass stage
by stage (`--flow`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from ..model import SimpleFeaturePyramid, build_model, find_architecture, registry
from ..weights import load_any
from ..weights.hub_cache import WEIGHTS_SUFFIXES
from . import options
from .commands import add_command
from .errors import UserError
from .options import model_options_given
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "summary",
        description="The table lists every module; --flow walks the forward pass, one line per "
        "stage with its measured output shape. The model options are the model family's "
        "(`vitkit models NAME --options`), set with --model-opt as in `vitkit train`.",
    )
    p.add_argument(
        "model",
        help="a registered model name (see `vitkit models`), or weights: a vitkit checkpoint, "
        "or timm / Hugging Face / torchvision / JAX weights, a file or a model folder",
    )
    options.batch_size(p, 1)
    p.add_argument(
        "--max-depth",
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
    p.add_argument(
        "--pyramid",
        type=options.int_in(1),
        metavar="CHANNELS",
        help="the model as a detection backbone: ViTDet's simple feature pyramid with CHANNELS "
        "channels per map (the model needs --dynamic-img-size)",
    )
    options.weights_reading(p)  # --num-heads: the weights' heads, or the registered model's
    options.model_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..summary import compare_params, flow, summary

    model = _model(args)
    size = (args.batch_size, *_input_size(model))
    if args.pyramid is not None:
        model = _pyramid(model, args)
    if not (args.flow or args.compare_torch):
        print(summary(model, size, max_depth=args.max_depth))
        return ExitCode.OK
    arch = find_architecture(model)
    if not callable(getattr(model, "describe_flow", None)):
        what = "a timm CNN" if arch is None else f"a {arch.title}, which has no stage walk"
        raise UserError(
            f"{args.model} is {what}: --flow and --compare-torch walk the ViT, Swin (V1, V2), "
            "EVA and BEiT families"
        )
    if args.compare_torch and (arch is None or "encoder" not in arch.option_names()):
        title = arch.title if arch is not None else "ViTDet pyramid"
        raise UserError(f"{args.model} is a {title}: --compare-torch compares ViT encoders")
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


def _pyramid(model: nn.Module, args: argparse.Namespace) -> SimpleFeaturePyramid:
    """The model as ViTDet's pyramid backbone (`--pyramid`)."""
    arch = find_architecture(model)
    if arch is None or arch.feature_unit != "block" or args.compare_torch:
        raise UserError("--pyramid takes a ViT, without --compare-torch")
    if not model.patch_embed.dynamic_img_size:
        raise UserError(
            "--pyramid needs a model that takes any input size: add --model-opt "
            "dynamic_img_size=true"
        )
    return SimpleFeaturePyramid(model, out_channels=args.pyramid)


def _input_size(model: nn.Module) -> tuple[int, ...]:
    """(C, H, W) of one input: the weights' data config, else the model's own size."""
    if model.data_config is not None:
        return tuple(model.data_config.input_size)
    return (model.config.in_chans, *model.patch_embed.img_size)


def _is_weights(name: str) -> bool:
    """True when `summary`'s argument names weights (a path) rather than a registered model."""
    path = Path(name)
    return path.exists() or "/" in name or path.suffix in WEIGHTS_SUFFIXES


def _weights_model(args: argparse.Namespace, encoder: str | None) -> nn.Module:
    """The model of the weights `args.model` (any `load_any` reads), or with `encoder` a
    model of their config with that encoder (for its parameter counts)."""
    given = model_options_given(args, None)
    num_heads = given.pop("num_heads", args.num_heads)  # what the weights do not record
    if given:
        raise UserError(
            f"{args.model} brings its own architecture, so the model options "
            f"{', '.join(sorted(given))} cannot apply: drop {'it' if len(given) == 1 else 'them'}"
        )
    model = load_any(args.model, num_heads=num_heads, arch=args.arch)
    if encoder is not None:
        model = build_model(model.config.replace(encoder=encoder, drop_path_rate=0.0))
    return model


def _model(args: argparse.Namespace, encoder: str | None = None) -> nn.Module:
    """The model of the weights `args.model` names, else the registered model with the model
    options of the command line (its family's, `--model-opt`)."""
    if _is_weights(args.model):
        return _weights_model(args, encoder)
    if args.arch is not None:
        raise UserError(
            f"--arch names the architecture of weights; {args.model} is a registered model: "
            "set its options with --model-opt (e.g. --model-opt depth=N)"
        )
    model_options = model_options_given(args, args.model)
    if args.num_heads is not None:
        model_options.setdefault("num_heads", args.num_heads)
    if encoder is not None:
        model_options["encoder"] = encoder
    return registry.create_model(args.model, **model_options)
