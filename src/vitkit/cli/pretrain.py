"""`vitkit pretrain`: MAE pretraining with the run folder and settings of `vitkit train`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .commands import add_command
from .status import ExitCode
from .train import OPTION_FLAGS, progress_bar, run_arguments, run_config

__all__ = ["OPTION_FLAGS", "register", "run"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "pretrain",
        description="Masked-autoencoder pretraining (He et al. 2022): the encoder sees 25%% of "
        "the patches, a light decoder rebuilds the rest. Takes the options of `vitkit train` "
        "(data, model, optimisation) and the MAE group; writes encoder.safetensors for "
        "`vitkit train --pretrained` and reconstructions.png every epoch.",
    )
    run_arguments(p, "runs/mae-<data>")
    return p


def run(args: argparse.Namespace) -> int:
    from ..train.pretrain import ENCODER, run_pretraining

    config, out = run_config(args, name_of=lambda data: f"mae-{Path(data).name}")
    history = run_pretraining(
        config, out, resume=args.resume, overwrite=args.overwrite,
        progress=progress_bar(not args.no_progress),
    )  # fmt: skip
    final = f"loss {history[-1]['loss']:.4f}; " if history else ""
    print(f"{final}encoder in {out / ENCODER}: fine-tune it with --pretrained")
    return ExitCode.OK
