"""`vitkit train`: a run's settings from the flags, a settings file or the run's own record
(`--resume`), then `run_training`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..train import read_settings, resolve_config, run_training
from ..train.config import GROWS, RUNTIME, TrainConfig
from ..train.fit import Progress
from ..train.recipes import RECIPE_OPTIONS, RECIPES, default_model
from ..train.setup import default_out
from ..weights import inspect
from ..weights.cnn import is_timm_name
from ..weights.timm import check_arch
from .commands import add_command
from .errors import UserError
from .options import add_train_options, train_flag, train_options_given
from .status import ExitCode

log = logging.getLogger("vitkit")

# The flags that give the library's options on this command line (`MissingOptionError`).
OPTION_FLAGS = {
    "num_heads": "--model-opt num_heads=N",
    "act_layer": "--model-opt act_layer=NAME",
    "norm_eps": "--model-opt norm_eps=EPS",
    "no_embed_class": "--model-opt no_embed_class=true",
    "arch": "--model NAME",
}


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "train",
        description="Train a ViT. Options left unset take the recipe's value (the data's own "
        "recipe, else a light one for tiny images and DeiT's otherwise); `config.json` records "
        "all.",
    )
    g = run_arguments(p, "runs/<name>")
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
    outcome = run_training(
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=progress_bar(not args.no_progress),
    )
    if outcome.test is None:
        if outcome.rank == 0:
            print(f"interrupted; continue with: vitkit train --out {out} --resume", file=sys.stderr)
        return ExitCode.INTERRUPTED
    if outcome.rank == 0:
        result = outcome.result
        print(f"best val top-1 {result.best_acc1:.4f} at epoch {result.best_epoch}; files in {out}")
        print(f"test accuracy: {outcome.test['acc1']:.4f}")
    return ExitCode.OK


def run_arguments(p: argparse.ArgumentParser, default_out: str) -> argparse._ArgumentGroup:
    """The `TrainConfig` flags and the run-folder flags of `train` and `pretrain`."""
    add_train_options(p, RECIPE_OPTIONS, tuple(RECIPES))
    g = p.add_argument_group("this invocation")
    g.add_argument("--out", help=f"output folder (default: {default_out})")
    g.add_argument("--name", help="run name for the default output folder")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return g


def progress_bar(enabled: bool) -> Progress:
    """tqdm on stderr, shown only on a terminal."""
    from tqdm import tqdm

    def make(iterable, total: int, desc: str):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            leave=False,
            dynamic_ncols=True,
            disable=not (enabled and sys.stderr.isatty()),
        )

    return make


def run_config(
    args: argparse.Namespace, name_of: Callable[[str], str | None] = lambda data: None
) -> tuple[TrainConfig, Path]:
    """The settings and folder of a `train` / `pretrain` run: the saved settings on --resume,
    else the options over --config over the recipe. Without --out the folder is
    `runs/<--name>`, else `runs/<name_of(data)>`, else `runs/<data>-<model>`, the same
    whether the run starts or resumes."""
    given = train_options_given(args)
    if args.resume:
        data = given.get("data", TrainConfig.data)
        model = given.get("model") or default_model(data)
    else:
        settings = getattr(args, "config", None)
        values = read_settings(settings, source=f"--config {settings}") if settings else {}
        config = resolve_config(_with_arch_hint(given, values), values)
        data, model = config.data, config.model
    out = Path(args.out) if args.out else default_out(data, model, args.name or name_of(data))
    return (_resumed_config(out, given) if args.resume else config), out


def _with_arch_hint(given: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`--model NAME` beside `--pretrained` names the weights' architecture: it reaches
    `load_pretrained` as `arch` (through the model options), which takes from it what the
    weights do not record and refuses a name whose sizes differ, so it is never ignored."""
    pretrained = given.get("pretrained", values.get("pretrained"))
    model = given.get("model")
    if not (pretrained and model) or is_timm_name(model):
        return given
    base = given["model_opts"] if "model_opts" in given else values.get("model_opts", {})
    info = inspect(pretrained, arch=model, overrides=base)
    if info.config is not None:
        check_arch(info.config, model, base)  # other sizes: another model, refused
    return {**given, "model_opts": {"arch": model, **base}}


def _resumed_config(out: Path, given: dict[str, Any]) -> TrainConfig:
    """The run's own settings; options given again must match them, except how the run
    executes (`RUNTIME`: threads, save_every, device, workers), which they change, and the
    options that may grow (`GROWS`: more epochs). What was taken is logged."""
    config_file = out / "config.json"
    if not config_file.is_file():
        raise UserError(f"--resume: {config_file} does not exist; start without --resume")
    saved = TrainConfig.from_dict(read_settings(config_file, complete=True), str(config_file))
    taken = {
        name: value
        for name, value in given.items()
        if name in RUNTIME or (name in GROWS and value >= getattr(saved, name))
    }
    changed = [n for n, v in given.items() if n not in taken and v != getattr(saved, n)]
    if changed:
        flags = ", ".join(f"{train_flag(n)} ({_saved(getattr(saved, n))})" for n in changed)
        grows = [train_flag(n) for n in changed if n in GROWS]
        hint = f"; {', '.join(grows)} may only grow" if grows else ""
        raise UserError(
            f"--resume continues {out} with its saved settings; it cannot change {flags}{hint}: "
            f"drop them, or start a new run with --config {config_file} and the new values"
        )
    for name, value in taken.items():
        if value != getattr(saved, name):
            log.info("--resume: taking %s %s (%s)", train_flag(name), value,
                     _saved(getattr(saved, name)))  # fmt: skip
    return saved.replace(**taken)


def _saved(value: Any) -> str:
    """How a resumed run's saved setting is named: 'saved 8', or 'unset in the run'."""
    return "unset in the run" if value is None else f"saved {value!r}"
