"""The `vitkit` command line: each subcommand parses its arguments and calls the library."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import registry
from .summary import summary

log = logging.getLogger("vitkit")


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit code 2."""


# -- train / eval / predict / explain handlers ---------------------------------------------


# -- convert handlers -----------------------------------------------------------------------

PARITY_TOLERANCE = 1e-4


def _cmd_convert(args: argparse.Namespace) -> int:
    import torch

    from . import convert
    from .checkpoint import CheckpointError, load_state_dict, save
    from .pretrained import load_pretrained

    options = {}
    if args.num_heads is not None:
        options["num_heads"] = args.num_heads
    if args.config is not None:
        if args.source != "hf":
            raise UserError("--config (a Hugging Face config.json) only goes with --from hf")
        options["config"] = args.config
    print(f"converting {args.input} ({args.source} weights) ...", flush=True)
    try:
        model = load_pretrained(args.input, format=args.source, **options)
    except CheckpointError as err:
        raise UserError(str(err)) from None
    cfg = model.config
    print(
        f"converted {len(model.state_dict())} tensors: embed_dim {cfg.embed_dim}, depth "
        f"{cfg.depth}, heads {cfg.num_heads}, patch {cfg.patch_size}, img_size {cfg.img_size}, "
        f"{cfg.num_classes} classes, pool {cfg.global_pool}",
        flush=True,
    )
    save(model, args.output, meta={"converted_from": args.source})
    print(f"wrote {args.output}", flush=True)
    if args.no_parity:
        return 0
    library = {"hf": "transformers", "jax": "timm"}.get(args.source, args.source)
    try:
        if args.source == "jax":
            weights = args.input
        else:
            weights = load_state_dict(_weights_file(args.input))
        reference = convert.source_model(args.source, cfg, weights)
    except ImportError:
        print(f"parity check skipped: {library} is not installed")
        return 0
    height, width = model.patch_embed.img_size
    x = torch.randn(2, cfg.in_chans, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(x) if cfg.num_classes else model.forward_features(x)
        diff = (ours - reference(x)).abs().max().item()
    verdict = "ok" if diff <= PARITY_TOLERANCE else "MISMATCH"
    print(
        f"parity vs {library}: max |difference| {diff:.2e} on a random batch of 2 "
        f"({verdict}, tolerance {PARITY_TOLERANCE:.0e})"
    )
    return 0 if verdict == "ok" else 1


def _weights_file(path: str) -> str:
    """The weights file of a path that may be a Hugging Face model folder."""
    from pathlib import Path

    folder = Path(path)
    if folder.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (folder / name).is_file():
                return str(folder / name)
    return path


# -- export handlers ------------------------------------------------------------------------


def _cmd_export(args: argparse.Namespace) -> int:
    import torch

    from .checkpoint import load
    from .export import export_onnx, export_program

    if args.verify and args.format != "onnx":
        raise UserError("--verify checks ONNX files; drop it for --format pt2")
    model = load(args.checkpoint)
    for name in ("onnx_ir", "onnxscript"):  # their INFO lines would drown ours
        logging.getLogger(name).setLevel(logging.WARNING)
    dynamic_batch = not args.static_batch
    dynamic_img_size = True if args.dynamic_img_size else None
    if args.format == "onnx":
        if args.verify:
            try:
                import onnxruntime  # noqa: F401
            except ImportError as err:
                raise UserError("--verify needs onnxruntime: pip install onnxruntime") from err
        export_onnx(
            model,
            args.output,
            dynamic_batch=dynamic_batch,
            dynamic_img_size=dynamic_img_size,
            opset=args.opset,
            verify=args.verify,
        )
    else:
        program = export_program(
            model, dynamic_batch=dynamic_batch, dynamic_img_size=dynamic_img_size
        )
        torch.export.save(program, args.output)
    dynamic = model.patch_embed.dynamic_img_size if dynamic_img_size is None else True
    print(
        f"wrote {args.output} ({args.format}; batch {'dynamic' if dynamic_batch else '1'}, "
        f"image size {'dynamic' if dynamic else 'x'.join(map(str, model.patch_embed.img_size))})"
    )
    return 0


# -- models / summary handlers --------------------------------------------------------------


def _cmd_models(args: argparse.Namespace) -> int:
    for name in registry.list_models(args.pattern):
        print(name)
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    overrides = {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.img_size is not None:
        overrides["img_size"] = (
            tuple(args.img_size) if len(args.img_size) == 2 else args.img_size[0]
        )
    model = registry.create_model(args.model, **overrides)
    size = model.patch_embed.img_size
    print(summary(model, (args.batch_size, model.config.in_chans, *size), max_depth=args.depth))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="Vision Transformers: train, evaluate, predict, explain."
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # -- train / eval / predict / explain parsers --

    # -- convert parser --

    p = sub.add_parser(
        "convert",
        help="convert timm / Hugging Face / torchvision / JAX weights to a vitkit file",
    )
    p.add_argument(
        "--from", dest="source", required=True, choices=["timm", "hf", "torchvision", "jax"]
    )
    p.add_argument("input", help="weights file (.safetensors/.pth/.bin/.npz) or HF model folder")
    p.add_argument("output", help="the vitkit .safetensors file to write")
    p.add_argument("--num-heads", type=int, help="attention heads (default: inferred)")
    p.add_argument("--config", help="Hugging Face config.json (default: the one beside IN)")
    p.add_argument("--no-parity", action="store_true", help="skip the output comparison")
    p.set_defaults(func=_cmd_convert)

    # -- export parser --

    p = sub.add_parser(
        "export",
        help="export a checkpoint to ONNX or a torch.export program (.pt2)",
        description="Export a checkpoint saved by vitkit for serving without vitkit. Dynamic: "
        "the batch (unless --static-batch) and, for a model built with dynamic_img_size or with "
        "--dynamic-img-size, height and width as multiples of the patch size.",
    )
    p.add_argument("output", help="the file to write, e.g. model.onnx or model.pt2")
    p.add_argument("--checkpoint", required=True, help="a checkpoint written by vitkit.save")
    p.add_argument("--format", choices=("onnx", "pt2"), default="onnx")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (18 or newer)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch size at 1")
    p.add_argument(
        "--dynamic-img-size",
        action="store_true",
        help="accept any multiple of the patch size (default: as the model was built)",
    )
    p.add_argument(
        "--verify", action="store_true", help="compare onnxruntime with PyTorch (within 1e-4)"
    )
    p.set_defaults(func=_cmd_export)

    # -- models / summary parsers --

    p = sub.add_parser("models", help="list the registered model names")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'vit_base*'")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("summary", help="per-layer shapes, parameters and FLOPs of a model")
    p.add_argument("model", help="a registered model name (see `vitkit models`)")
    p.add_argument("--img-size", type=int, nargs="+", metavar="N", help="input size: N or H W")
    p.add_argument("--num-classes", type=int, help="head outputs (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--depth", type=int, default=2, help="deepest module level listed")
    p.set_defaults(func=_cmd_summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 user error, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (UserError, ValueError, TypeError, OSError) as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
