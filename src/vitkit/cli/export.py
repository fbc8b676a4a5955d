"""`vitkit export`: a checkpoint as ONNX, a torch.export program, or a Hugging Face / timm
folder, for serving without vitkit."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch

from ..files import check_output
from ..model import find_architecture
from ..weights import inspect, load_any
from ..weights.families import weights_family
from . import options
from .commands import add_command
from .errors import UserError
from .progress import progress
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "export",
        description="Export a checkpoint saved by vitkit for serving without vitkit. Dynamic: "
        "the batch (unless --static-batch) and, for a model built with dynamic_img_size or with "
        "--dynamic-img-size, height and width as multiples of the patch size.",
    )
    p.add_argument(
        "output",
        help="the file to write (model.onnx, model.pt2) or, for --format hf / timm, the folder",
    )
    options.checkpoint(p)
    p.add_argument(
        "--format",
        choices=("onnx", "pt2", "hf", "timm"),
        default="onnx",
        help="onnx, a torch.export program (pt2), or a folder that Hugging Face transformers "
        "(hf) or timm (timm) loads, with the model's preprocessing",
    )
    p.add_argument(
        "--opset", type=int, default=18, metavar="N", help="ONNX opset (18 or newer; default: 18)"
    )
    p.add_argument("--static-batch", action="store_true", help="fix the batch size at 1")
    p.add_argument(
        "--dynamic-img-size",
        action="store_true",
        help="accept any multiple of the patch size (default: as the model was built)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="compare onnxruntime with PyTorch (within 1e-4; with int8, the float32 graph "
        "before quantising)",
    )
    options.precision(p, export=True)
    options.quiet(p)
    options.weights_reading(p)
    options.preparation(p)
    return p


def run(args: argparse.Namespace) -> int:
    model = _exportable(args)
    if args.format in ("hf", "timm"):
        folders = weights_family(model.config).folders
        if args.format not in folders:
            title = find_architecture(model.config).title
            raise UserError(f"vitkit writes no {args.format} folder of a {title}; export onnx")
        folders[args.format](model, args.output)
        loads = {
            "hf": "transformers' from_pretrained; its image processor (AutoImageProcessor: "
            "TimmWrapperImageProcessor) needs timm installed",
            "timm": f"timm.create_model('local-dir:{args.output}', pretrained=True)",
        }[args.format]
        print(f"wrote {args.output}/ ({args.format} folder, with its preprocessing; {loads})")
        return ExitCode.OK
    from ..export import exports_dynamic_img_size

    check_output(args.output)  # a FIFO or a folder is refused before the export
    carried = _write_file(model, args)
    dynamic_batch = not args.static_batch
    dynamic = exports_dynamic_img_size(model, True if args.dynamic_img_size else None)
    size = "dynamic" if dynamic else "x".join(map(str, model.patch_embed.img_size))
    carries = _listed(carried) or "no class names or data config"
    print(
        f"wrote {args.output} ({args.format}; batch {'dynamic' if dynamic_batch else '1'}, "
        f"image size {size}; carries {carries})"
    )
    return ExitCode.OK


def _listed(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _write_file(model: torch.nn.Module, args: argparse.Namespace) -> list[str]:
    """Write the ONNX file or torch.export program; what it carries besides the model."""
    from ..export import (
        CLASS_NAMES_PROP,
        DATA_CONFIG_PROP,
        THRESHOLD_PROP,
        export_onnx,
        onnx_metadata,
    )

    for name in ("onnx_ir", "onnxscript"):  # their INFO lines would drown ours
        logging.getLogger(name).setLevel(logging.WARNING)
    shapes = {
        "dynamic_batch": not args.static_batch,
        "dynamic_img_size": True if args.dynamic_img_size else None,
    }
    if args.format == "pt2":
        from ..export import export_program, save_program

        save_program(export_program(model, **shapes), args.output)
        return []
    import onnxscript  # noqa: F401  (torch's exporter needs it; missing: the hint of `main`)

    if args.verify:
        import onnxruntime  # noqa: F401  (missing: the one-line hint of `main`)
    export_onnx(
        model,
        args.output,
        opset=args.opset,
        verify=args.verify,
        precision=args.precision,
        progress=progress(args.quiet, unit="steps"),
        **shapes,
    )
    props = onnx_metadata(model)
    named = (
        (CLASS_NAMES_PROP, "the class names"),
        (DATA_CONFIG_PROP, "the data config"),
        (THRESHOLD_PROP, "the multi-label threshold"),
    )
    return [what for key, what in named if key in props]


def _exportable(args: argparse.Namespace) -> torch.nn.Module:
    """The checkpoint's model at the asked precision; what the format cannot take is refused."""
    if args.verify and args.format != "onnx":
        raise UserError(f"--verify checks ONNX files; drop it for --format {args.format}")
    info = inspect(args.checkpoint, num_heads=args.num_heads, arch=args.arch)
    if info.format == "timm-cnn":
        raise UserError(
            f"{args.checkpoint} holds a timm CNN ({info.cnn['name']}); vitkit exports ViTs: "
            "export the CNN with timm or torch.onnx.export"
        )
    arch = find_architecture(info.config)
    if arch is not None and arch.fixed_export_size is not None and args.dynamic_img_size:
        raise UserError(f"--dynamic-img-size: {arch.fixed_export_size}; drop it")
    model = load_any(info, num_heads=args.num_heads, arch=args.arch)
    model.data_config = options.prepared(model.data_config, args)
    if args.precision == "int8" and args.format != "onnx":
        raise UserError(
            f"--precision int8 exports ONNX only (onnxruntime's quantiser); a {args.format} "
            "export keeps float weights: quantise after loading (vitkit predict / eval "
            "--precision int8, or vitkit.model.precision.set_precision)"
        )
    if args.precision == "bf16":
        if args.format == "onnx":
            raise UserError(
                "--precision bf16 is not offered for ONNX (onnxruntime's CPU provider has no "
                "bf16 kernels for the model's products); export fp32, or --precision int8"
            )
        model.to(torch.bfloat16)
    return model
