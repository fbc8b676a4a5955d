"""The commands: name -> (module, one-line summary). A module is imported only when its
command runs (or its help is asked), so `vitkit --help` loads none of them (pip's
`commands/__init__.py`)."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .parser import debug_flag


@dataclass(frozen=True)
class Command:
    """A command: its module, its one-line summary, and the extra it needs (its optional
    packages, named by the fix when one is missing)."""

    module: str
    summary: str
    extra: str | None = None


COMMANDS: dict[str, Command] = {
    "train": Command("train", "train a ViT (default: vit_digits on the built-in digits)"),
    "pretrain": Command(
        "pretrain", "MAE self-supervised pretraining of a ViT on the training images (no labels)"
    ),
    "eval": Command(
        "eval", "loss, top-1 / top-k, per-class scores and a confusion matrix of a checkpoint"
    ),
    "predict": Command("predict", "top classes and probabilities of images"),
    "explain": Command(
        "explain",
        "what the model looks at: class relevance, attention rollout and [CLS] attention over "
        "an image",
    ),
    "serve": Command(
        "serve",
        "serve a checkpoint over HTTP: /predict, /explain, a page to try it; batched",
        extra="serve",
    ),
    "convert": Command(
        "convert", "convert timm / Hugging Face / torchvision / JAX weights to a vitkit file"
    ),
    "export": Command(
        "export", "export a checkpoint to ONNX, a torch.export program, or an HF / timm folder"
    ),
    "shards": Command(
        "shards", "write an image folder as tar shards (webdataset's layout) with their info file"
    ),
    "models": Command(
        "models", "list the registered model names, or the options of one (NAME --options)"
    ),
    "summary": Command(
        "summary",
        "per-layer shapes, parameters and FLOPs of a model, or its forward pass stage by stage "
        "(--flow)",
    ),
}


def command_module(name: str) -> ModuleType:
    """The module of command `name` (`register(subparsers)`, `run(args)`)."""
    return importlib.import_module(f"{__package__}.{COMMANDS[name].module}")


def add_command(subparsers: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """The sub-parser of command `name`, with its one-line summary as its help (and
    `--debug`, which may come after the command too); the parsed arguments hold it as
    `command_parser`."""
    parser = subparsers.add_parser(name, help=COMMANDS[name].summary, **kwargs)
    debug_flag(parser, default=argparse.SUPPRESS)
    parser.set_defaults(command_parser=parser)  # so that a hint can name the command's flags
    return parser
