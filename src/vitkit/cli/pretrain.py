"""`vitkit pretrain`: MAE pretraining with the run folder and settings of `vitkit train`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..train.config import PretrainConfig
from .commands import add_command
from .output import json_text
from .progress import progress
from .status import ExitCode
from .train import run_arguments, run_config


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "pretrain",
        usage="%(prog)s [FLAGS]",  # the flags, grouped, are listed below
        description="Masked-autoencoder pretraining (He et al. 2022): the encoder sees 25% of "
        "the patches, a light decoder rebuilds the rest. Takes the data, model, optimisation "
        "and run options of `vitkit train` and the MAE group; writes encoder.safetensors for "
        "`vitkit train --pretrained` and reconstructions.png every epoch.",
    )
    run_arguments(p, "runs/mae-<data>", PretrainConfig)
    return p


def run(args: argparse.Namespace) -> int:
    from ..train import MaeTask, run_job
    from ..train.run_folder import ENCODER_FILE

    config, out = run_config(args, name_of=lambda data: f"mae-{Path(data).name}")
    outcome = run_job(
        MaeTask,
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=progress(args.quiet, batch_size=config.batch_size),
    )
    result = outcome.result
    if outcome.rank != 0:
        return ExitCode.INTERRUPTED if result.interrupted else ExitCode.OK
    if args.json:
        print(json_text(outcome.summary()))
    if result.interrupted:
        print(f"interrupted; continue with: vitkit pretrain --out {out} --resume", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if not args.json:
        history = result.history
        final = f"loss {history[-1]['train_loss']:.4f}; " if history else ""
        print(f"{final}encoder in {out / ENCODER_FILE}: fine-tune it with --pretrained")
    return ExitCode.OK
