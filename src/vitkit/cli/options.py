"""Flags and argument types shared by several commands, declared once, and the one place that
reaches `TrainConfig`'s generated flags (`train.flags`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..data.data_config import INTERPOLATIONS, DataConfig
from ..model.precision import PRECISIONS


def int_in(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`, else one line naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


# -- shared flags: each declared here once ----------------------------------------------------


# The flags of the weights-reading options, for the library's hints (`MissingOptionError`).
WEIGHTS_FLAGS = {"num_heads": "--num-heads N", "arch": "--arch NAME"}


def checkpoint(parser: argparse.ArgumentParser) -> None:
    """`--checkpoint PATH`: the weights a command runs (eval, predict, explain, export)."""
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="the model's weights: a vitkit checkpoint (a run's model.safetensors), or timm / "
        "Hugging Face / torchvision / JAX weights, a file or a model folder",
    )


def model_run(parser: argparse.ArgumentParser, *, precision_flag: bool = True) -> None:
    """The flags of a command that runs `--checkpoint`'s model on images: where and at which
    precision it runs, what its weights do not record, and the image preparation."""
    device(parser)
    if precision_flag:
        precision(parser)
    weights_reading(parser)
    preparation(parser)


def weights_reading(parser: argparse.ArgumentParser) -> None:
    """`--arch`, `--num-heads`: what a state dict does not record."""
    group = parser.add_argument_group("weights that do not record their architecture")
    group.add_argument(
        "--arch",
        metavar="NAME",
        help="the timm model name of the weights (`vitkit models`): their heads, activation, "
        "norm epsilon and pooling, which a state dict does not record",
    )
    group.add_argument(
        "--num-heads",
        type=int_in(1),
        metavar="N",
        help="attention heads, which most weights do not record (default: the standard count "
        "of their width)",
    )


def preparation(parser: argparse.ArgumentParser) -> None:
    """`--mean`, `--std`, `--crop-pct`, `--interpolation`: the data config, over the one the
    weights state (or the one assumed for them)."""
    group = parser.add_argument_group(
        "image preparation (default: the weights' data config, or their family's)"
    )
    for name, what in (("mean", "mean"), ("std", "standard deviation")):
        group.add_argument(
            f"--{name}",
            type=float,
            nargs="+",
            metavar="X",
            help=f"per-channel {what} of pixels in [0, 1]: one value, or one per channel",
        )
    group.add_argument(
        "--crop-pct",
        type=float,
        metavar="F",
        help="resize to the input size / F, then crop the centre (1: no margin)",
    )
    group.add_argument("--interpolation", choices=INTERPOLATIONS, help="the resize filter")


def prepared(data_config: DataConfig, args: argparse.Namespace) -> DataConfig:
    """`data_config` with the preparation flags given on the command line."""
    one = {name: getattr(args, name) for name in ("mean", "std")}
    one = {name: v[0] if v is not None and len(v) == 1 else v for name, v in one.items()}
    changes = {**one, "crop_pct": args.crop_pct, "interpolation": args.interpolation}
    if args.crop_pct is not None:
        changes["crop_mode"] = "center"
    try:
        return data_config.replace(**changes)
    except ValueError as err:
        raise ValueError(f"the image preparation flags: {err}") from None


def device(parser: argparse.ArgumentParser) -> None:
    """`--device`: where the model runs."""
    parser.add_argument(
        "--device",
        metavar="DEVICE",
        help="where the model runs: cpu, cuda or cuda:N (default: cuda when available)",
    )


def batch_size(parser: argparse.ArgumentParser, default: int) -> None:
    """`--batch-size N`: images per forward pass."""
    parser.add_argument(
        "--batch-size",
        type=int_in(1),
        default=default,
        metavar="N",
        help=f"images per forward pass (default: {default})",
    )


def json_output(parser: argparse.ArgumentParser, document: str) -> None:
    """`--json`: print `document` (e.g. 'one JSON object') instead of text."""
    parser.add_argument("--json", action="store_true", help=f"print {document} instead of text")


def precision(parser: argparse.ArgumentParser, export: bool = False) -> None:
    """`--precision fp32|bf16|int8`: how the model runs (or, with `export`, is written)."""
    what = (
        "bf16 weights (folders, pt2) or an int8-quantised ONNX file (onnxruntime's dynamic "
        "quantiser)"
        if export
        else "bf16 where the CPU has native bf16 (else fp32, with a note), or int8 dynamic "
        "quantisation of every Linear (CPU)"
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help=f"{what} (default: fp32)"
    )


# -- TrainConfig's flags: the lead switches these two to the option schema ------------------


def add_train_options(
    parser: argparse.ArgumentParser,
    recipe_options: frozenset[str] = frozenset(),
    recipes: Sequence[str] = (),
    *,
    only: Mapping[str, str | None] | None = None,
    title: str = "",
) -> Any:
    """`TrainConfig`'s flags (all, or `only` these with their help) on `parser`."""
    from ..train import flags as train_flags

    return train_flags.add_arguments(parser, recipe_options, recipes, only=only, title=title)


def train_options_given(args: argparse.Namespace) -> dict[str, Any]:
    """The `TrainConfig` values the command line set."""
    from ..train import flags as train_flags

    return train_flags.given_options(args)


def train_flag(name: str) -> str:
    """The flag of `TrainConfig` field `name` (e.g. 'model_opts' -> '--model-opt')."""
    import dataclasses

    from ..train import flags as train_flags
    from ..train.config import TrainConfig

    (item,) = [f for f in dataclasses.fields(TrainConfig) if f.name == name]
    return train_flags.flag_name(item)
