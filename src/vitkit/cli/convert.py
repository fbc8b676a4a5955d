"""`vitkit convert`: timm / Hugging Face / torchvision / JAX weights to a vitkit checkpoint,
checked against the source library's own model of the weights (`weights.parity`): the named
timm model, the folder's transformers model, the torchvision builder; where the source names
none, the line says that only the key mapping was checked and what the weights do not record."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from . import options
from .commands import add_command
from .errors import UserError
from .status import ExitCode

# How the parity line names what would complete the check.


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "convert")
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=["timm", "hf", "torchvision", "jax"],
        help="the library the weights come from",
    )
    p.add_argument(
        "input",
        help="weights file (.safetensors/.pth/.bin/.npz) or a model folder, or a Hub id in the "
        "local Hugging Face cache (timm/NAME, hf-hub:ORG/NAME, ORG/NAME)",
    )
    p.add_argument("output", help="the vitkit .safetensors file to write")
    options.weights_reading(p)
    p.add_argument(
        "--hf-config",
        metavar="JSON",
        help="a Hugging Face config.json, with --from hf (default: the one beside INPUT)",
    )
    p.add_argument(
        "--no-parity",
        action="store_true",
        help="skip the comparison with the source library's own model",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from ..model import architecture_of, list_models
    from ..weights import load_pretrained, save
    from ..weights.hub_cache import resolve_weights
    from ..weights.parity import reading_options

    if args.hf_config is not None and args.source != "hf":
        raise UserError("--hf-config (a Hugging Face config.json) only goes with --from hf")
    print(f"converting {args.input} ({args.source} weights) ...", flush=True)
    source = resolve_weights(args.input)  # a Hub id: its folder in the local cache
    reading = reading_options(source, args.source, arch=args.arch, num_heads=args.num_heads)
    model = load_pretrained(source, format=args.source, hf_config=args.hf_config, **reading)
    cfg = model.config
    staged = architecture_of(cfg).feature_unit == "stage"  # depths and windows, not depth
    depth = f"depths {cfg.depths}" if staged else f"depth {cfg.depth}"
    windows = f", windows {cfg.windows}" if staged else ""
    print(
        f"converted {len(model.state_dict())} tensors: embed_dim {cfg.embed_dim}, {depth}, "
        f"heads {cfg.num_heads}{windows}, patch {cfg.patch_size}, img_size {cfg.img_size}, "
        f"{cfg.num_classes} classes, pool {cfg.global_pool}",
        flush=True,
    )
    meta = {**getattr(model, "meta", {}), "converted_from": args.source}  # class names kept
    if reading.get("arch") in list_models():  # the name the options came from
        meta["model_name"] = reading["arch"]
    save(model, args.output, meta=meta)
    print(f"wrote {args.output}", flush=True)
    if args.no_parity:
        return ExitCode.OK
    return parity(args, model, source)


def parity(args: argparse.Namespace, model: torch.nn.Module, source: Path) -> int:
    """The converted model beside the source library's own model of the weights: one line
    saying what was compared and what was not; a disagreement exits with FAILED."""
    from ..weights.parity import check_parity

    result = check_parity(
        model,
        source,
        args.source,
        arch=args.arch,
        num_heads=args.num_heads,
        hf_config=args.hf_config,
    )
    print(result.line(options.option_flags(args)), flush=True)
    return ExitCode.FAILED if result.failed else ExitCode.OK
