"""`vitkit train`: a run's settings from the flags, a settings file or the run's own record
(`--resume`), then `run_job` of the classification task."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..options import read_settings
from ..train import ClassificationTask, resolve_config, run_job
from ..train.config import JobConfig, TrainConfig
from ..train.recipes import default_model
from ..train.run_folder import default_out, read_run_config
from .commands import add_command
from .errors import UserError
from .options import job_flags, job_options_given, quiet
from .output import json_text
from .progress import progress
from .status import ExitCode

log = logging.getLogger("vitkit")


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "train",
        usage="%(prog)s [FLAGS]",  # the flags, grouped, are listed below
        description="Train a classifier (a ViT, a Swin Transformer: `vitkit models`). Options "
        "left unset take the recipe's value (the data's own "
        "recipe, else a light one for tiny images and DeiT's otherwise); `config.json` records "
        "all.",
    )
    g = run_arguments(p, "runs/<name>", TrainConfig)
    g.add_argument(
        "--config",
        metavar="JSON",
        help="settings from a file: a run's config.json or a flat object of the names of these "
        'options (e.g. {"epochs": 10}); options given here override it',
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.resume and args.config:
        raise UserError(
            "--config starts a new run from a settings file; --resume continues with the "
            "settings in the run's config.json: drop one of them"
        )
    config, out = run_config(args)
    outcome = run_job(
        ClassificationTask,
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=progress(args.quiet, batch_size=config.batch_size),
    )
    if outcome.rank != 0:
        return ExitCode.INTERRUPTED if outcome.test is None else ExitCode.OK
    if args.json:
        print(json_text(outcome.summary()))
    if outcome.test is None:
        print(f"interrupted; continue with: vitkit train --out {out} --resume", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if not args.json:
        result = outcome.result
        best = "mAP" if "map" in outcome.test else "top-1"  # a multi-label model's: mAP
        print(f"best val {best} {result.best:.4f} at epoch {result.best_epoch}; files in {out}")
        if "map" in outcome.test:
            print(f"test mAP: {outcome.test['map']:.4f}  F1: {outcome.test['f1']:.4f}")
        else:
            print(f"test accuracy: {outcome.test['acc1']:.4f}")
    return ExitCode.OK


def run_arguments(
    p: argparse.ArgumentParser, default_out: str, job: type[JobConfig]
) -> argparse._ArgumentGroup:
    """The flags of the job's config and the run-folder flags of `train` and `pretrain`."""
    job_flags(p, job)
    g = p.add_argument_group("this invocation")
    g.add_argument("--out", help=f"output folder (default: {default_out})")
    g.add_argument("--name", help="run name for the default output folder")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    quiet(g)
    g.add_argument(
        "--json",
        action="store_true",
        help="print the run's summary as one JSON object instead of text (the folder, epochs, "
        "best and last epoch, test metrics, files)",
    )
    return g


def run_config(
    args: argparse.Namespace, name_of: Callable[[str], str | None] = lambda data: None
) -> tuple[JobConfig, Path]:
    """The settings and folder of a `train` / `pretrain` run: the saved settings on --resume,
    else the options over --config over the recipe. Without --out the folder is
    `runs/<--name>`, else `runs/<name_of(data)>`, else `runs/<data>-<model>`, the same
    whether the run starts or resumes; `<model>` is the weights' name (their file or
    folder's) when --pretrained gives the architecture."""
    job = args.job
    given = job_options_given(args)
    if args.resume and args.overwrite:  # before the saved settings are looked for
        raise UserError("--resume and --overwrite exclude each other: drop one")
    if args.resume:
        data = given.get("data", job.data)
        model = _model_name(
            given.get("model"), given.get("pretrained"), data, given.get("data_dir")
        )
    else:
        settings = getattr(args, "config", None)
        values = read_settings(settings, job, source=f"--config {settings}") if settings else {}
        config = resolve_config(given, values, job)
        data = config.data
        model = _model_name(
            config.model, getattr(config, "pretrained", None), data, config.data_dir
        )
    out = Path(args.out) if args.out else default_out(data, model, args.name or name_of(data))
    return (_resumed_config(out, given, job) if args.resume else config), out


def _model_name(model: str | None, pretrained: str | None, data: str, data_dir: str | None) -> str:
    """The model part of a run folder's default name."""
    if model:
        return model
    if pretrained:
        return Path(pretrained).name.split(".")[0] or "pretrained"
    return default_model(data, data_dir)


def _resumed_config(out: Path, given: dict[str, Any], job: type[JobConfig]) -> JobConfig:
    """The run's own settings with the options given again (model options key by key);
    `run_job` checks what may change on a resume."""
    saved = read_run_config(out, job)
    if "model_opts" in given:
        given = {**given, "model_opts": {**saved.model_opts, **given["model_opts"]}}
    return saved.replace(**given)
