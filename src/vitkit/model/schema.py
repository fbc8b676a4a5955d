"""A model's options by name: the schema of its family (the config class of its record), the
typed and checked values of `--model-opt KEY=VALUE` and of settings files, and the few options
every family has, which commands take as flags of their own (`--img-size`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..options import REQUIRED, Options, check_value, close_names, from_text, option, option_names
from .architecture import Architecture
from .registry import architecture_of, get_architecture, get_config


def model_architecture(name: str | None) -> Architecture:
    """The architecture of model `name` (its preset's family record, whose config class is the
    option schema); the ViT's without a name (every default model is a ViT, and pretrained
    weights are read as one until loaded)."""
    return get_architecture("vit") if name is None else architecture_of(get_config(name))


def check_model_options(model: str | None, values: dict[str, Any]) -> dict[str, Any]:
    """The model options `values` for model `model`, typed and checked by its architecture's
    schema (text such as '2,2,2,2' in the option's type); an unknown name is one TypeError
    naming the architecture, the name and the close names among its options."""
    arch = model_architecture(model)
    schema = arch.config_class
    known = option_names(schema)
    for key in values:
        if key not in known:
            close = close_names(key, known)
            shown = f"the {arch.title} {model}" if model else "a ViT"
            raise TypeError(
                f"unknown option {key!r} for {shown}"
                + (f"; close: {', '.join(close)}" if close else "")
                + f"; see vitkit models {model or 'vit_base_patch16_224'} --options"
            )
    return {k: check_value(schema, k, from_text(schema, k, v)) for k, v in values.items()}


@dataclass(frozen=True, kw_only=True)
class SharedModelOptions(Options):
    """The model options every architecture has, which `train` and `pretrain` take as flags
    of their own (`--img-size 32`); any other goes through `--model-opt KEY=VALUE`. Checked,
    with the rest, by the chosen architecture's schema; the preset gives the defaults."""

    NOUN = "model option"
    GROUPS: ClassVar[dict[str, str]] = {"model": "model"}

    img_size: int | tuple[int, int] = option(
        REQUIRED, "input size: N or H W; default: the data's, else the preset's",
        metavar="N", group="model",
    )  # fmt: skip
    in_chans: int = option(
        REQUIRED, "input channels: how image files are read, 1 or 3; default: the data's",
        metavar="N", group="model",
    )  # fmt: skip
    drop_path_rate: float = option(
        REQUIRED, "stochastic depth rate at the last block; default: the preset's",
        metavar="RATE", group="model",
    )  # fmt: skip
