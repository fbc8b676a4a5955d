"""Flags and argument types shared by several commands, declared once: the weights a command
runs and how, and the flags generated from the option schemas (a job's config, the model's,
the data config's)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..data.data_config import DataConfig, data_config_flags
from ..inference import Predictor, load_for_inference, with_overrides
from ..model import architectures
from ..model.precision import PRECISIONS
from ..model.schema import SharedModelOptions, check_model_options
from ..options import option_fields
from ..options.flags import add_flags, flag_forms, flag_of, given_options

if TYPE_CHECKING:
    from ..train.config import JobConfig


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


def checkpoint(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """`--checkpoint PATH`: the weights a command runs (eval, predict, explain, export)."""
    parser.add_argument(
        "--checkpoint",
        required=required,
        metavar="PATH",
        help="the model's weights: a vitkit checkpoint (a run's model.safetensors), or timm / "
        "Hugging Face / torchvision / JAX weights, a file or a model folder, or a Hub id in the "
        "local Hugging Face cache (timm/NAME, hf-hub:ORG/NAME, ORG/NAME)",
    )


def model_run(parser: argparse.ArgumentParser, *, precision_flag: bool = True) -> None:
    """The flags of a command that runs `--checkpoint`'s model on images: where and at which
    precision it runs, what its weights do not record, and the image preparation."""
    device(parser)
    if precision_flag:
        precision(parser)
    weights_reading(parser)
    preparation(parser)


def load_predictor(
    args: argparse.Namespace,
    *,
    purpose: str,
    explanations: bool = False,
) -> Predictor:
    """`inference.load_for_inference` of `--checkpoint` with what `model_run`'s flags say
    (fp32 where the command has no `--precision`)."""
    from ..train.config import resolve_device  # the training package only where a model loads

    return load_for_inference(
        args.checkpoint,
        device=resolve_device(args.device),
        precision=getattr(args, "precision", "fp32"),
        arch=args.arch,
        num_heads=args.num_heads,
        data_overrides=preparation_given(args),
        purpose=purpose,
        explanations=explanations,
    )


def weights_reading(parser: argparse.ArgumentParser, *, num_heads: bool = True) -> None:
    """`--arch`, `--num-heads`: what a state dict does not record (without `num_heads` where
    the command's model flags have their own `--num-heads`)."""
    group = parser.add_argument_group("weights that do not record their architecture")
    group.add_argument(
        "--arch",
        metavar="NAME",
        help="the timm model name of the weights (`vitkit models`): their heads, activation, "
        "norm epsilon and pooling, which a state dict does not record",
    )
    if not num_heads:
        return
    group.add_argument(
        "--num-heads",
        type=int_in(1),
        metavar="N",
        help="attention heads, which most weights do not record (default: the standard count "
        "of their width)",
    )


def preparation(parser: argparse.ArgumentParser) -> None:
    """`--mean`, `--std`, `--crop-pct`, `--crop-mode`, `--interpolation`: the data config's own
    flags (`DataConfig`), over the one the weights state (or the one assumed for them)."""
    data_config_flags(parser)


def prepared(data_config: DataConfig, args: argparse.Namespace) -> DataConfig:
    """`data_config` with the preparation flags given on the command line (`--crop-pct`
    alone crops the centre)."""
    return with_overrides(data_config, preparation_given(args))


def preparation_given(args: argparse.Namespace) -> dict[str, Any]:
    """The data config options the preparation flags set."""
    return given_options(args, DataConfig)


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


def quiet(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--quiet`: no progress (bar or lines) for a command a user waits on (`cli.progress`)."""
    parser.add_argument(
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help="show no progress: no bar on a terminal, no progress lines in a log (results, "
        "warnings and errors still print)",
    )


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


# -- the options of a job's config and of the model, from their schemas ----------------------


def job_flags(parser: argparse.ArgumentParser, job: type[JobConfig]) -> None:
    """The flags of `job`'s config (`TrainConfig` or `PretrainConfig`), the model options
    among them; `job_options_given` reads back those given."""
    from ..train.recipes import RECIPE_OPTIONS, RECIPES

    notes = dict.fromkeys(RECIPE_OPTIONS, "recipes may change it")
    add_flags(parser, job, notes=notes, choices={"recipe": tuple(RECIPES)})
    parser.set_defaults(job=job)


def job_options_given(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the command's job config that the command line set."""
    return given_options(args, args.job)


MODEL_OPT_HELP = "any model option by name, the value as JSON or text, e.g. depth=6 (repeatable)"


def model_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for each option every family has (`--img-size`), and `--model-opt KEY=VALUE`
    for any option of the model's own family (`vitkit models NAME --options`)."""
    add_flags(
        parser, SharedModelOptions, show_defaults=False, generic=("model-opt", MODEL_OPT_HELP)
    )


def model_options_given(args: argparse.Namespace, model: str | None) -> dict[str, Any]:
    """The model options the command line set (`model_flags`), typed and checked by the
    schema of `model`'s family."""
    return check_model_options(model, given_options(args, SharedModelOptions, generic="model-opt"))


def flag_of_option(config_cls: type, name: str) -> str:
    """The flag of option `name` of `config_cls` (e.g. 'model_opts' -> '--model-opt')."""
    return flag_of(option_fields(config_cls)[name])


def option_flags(args: argparse.Namespace) -> dict[str, str]:
    """How the parsed command line gives each library option a hint may name (option ->
    '--num-heads N'), from its parser's flags: its own flag, else `--model-opt NAME=...` for
    a ViT option; a job's `model` gives the weights' architecture (`arch`)."""
    parser = getattr(args, "command_parser", None)
    if parser is None:
        return {}
    forms: dict[str, str] = {}
    for arch in architectures():  # each family's options through --model-opt
        forms = {**flag_forms(parser, arch.config_class), **forms}
    job = getattr(args, "job", None)
    for name, item in option_fields(job).items() if job is not None else ():
        alias = item.metadata.get("reads_as")
        if alias and name in forms:
            forms[alias] = forms[name]
    return forms


def threshold(parser: argparse.ArgumentParser) -> None:
    """`--threshold`: where a multi-label model's labels start."""
    parser.add_argument(
        "--threshold",
        type=probability,
        metavar="P",
        help="a multi-label model's labels are the classes whose sigmoid reaches P (default: "
        "the checkpoint's, recorded by vitkit train --threshold, else 0.5)",
    )


def probability(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value
