"""`vitkit convert`: timm / Hugging Face / torchvision / JAX weights to a vitkit checkpoint,
checked against the source library's own model when it is installed."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from . import options
from .commands import add_command
from .errors import UserError
from .status import ExitCode

PARITY_TOLERANCE = 1e-4
OPTION_FLAGS = options.WEIGHTS_FLAGS


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(subparsers, "convert")
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=["timm", "hf", "torchvision", "jax"],
        help="the library the weights come from",
    )
    p.add_argument("input", help="weights file (.safetensors/.pth/.bin/.npz) or a model folder")
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
        help="skip the comparison with the source library's output",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from ..weights import load_pretrained, save

    if args.hf_config is not None and args.source != "hf":
        raise UserError("--hf-config (a Hugging Face config.json) only goes with --from hf")
    print(f"converting {args.input} ({args.source} weights) ...", flush=True)
    model = load_pretrained(
        args.input,
        format=args.source,
        num_heads=args.num_heads,
        arch=args.arch,
        hf_config=args.hf_config,
    )
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
        return ExitCode.OK
    return parity(args, model)


def parity(args: argparse.Namespace, model: torch.nn.Module) -> int:
    """The converted model's output beside the source library's on a random batch."""
    from .. import convert
    from ..weights import load_state_dict, weights_file

    cfg = model.config
    library = {"hf": "transformers", "jax": "timm"}.get(args.source, args.source)
    try:
        if args.source == "jax":
            weights = args.input
        else:
            weights = load_state_dict(weights_file(args.input))
        reference = convert.source_model(args.source, cfg, weights)
    except ImportError:
        print(f"parity check skipped: {library} is not installed")
        return ExitCode.OK
    height, width = model.patch_embed.img_size
    x = torch.randn(2, cfg.in_chans, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, ours = reference(x), model(x)
        if ours.shape != want.shape:  # a headless reference giving its tokens (HF's ViTModel)
            ours = model.forward_features(x)
        if ours.shape != want.shape:
            raise UserError(
                f"the parity check cannot compare vitkit's output {tuple(ours.shape)} with "
                f"{library}'s {tuple(want.shape)}; {args.output} is written: pass --no-parity"
            )
        diff = (ours - want).abs().max().item()
    verdict = "ok" if diff <= PARITY_TOLERANCE else "MISMATCH"
    print(
        f"parity vs {library}: max |difference| {diff:.2e} on a random batch of 2 "
        f"({verdict}, tolerance {PARITY_TOLERANCE:.0e})"
    )
    return ExitCode.OK if verdict == "ok" else ExitCode.FAILED
