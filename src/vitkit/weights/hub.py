"""What every family's converters and folder exporters share of the Hugging Face and timm
Hub files: a `config.json` read as a dict, transformers' activation names, the one-line error
for keys no rule maps, and the files of an exported folder (`preprocessor_config.json`, the
class names, JSON written atomically, a whole Hugging Face folder, the model's data config).

Nothing here knows a model family; the families' rooms (`vit/`, `swin/`) build on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save as serialize_safetensors
from torch import Tensor, nn

from ..data.data_config import DataConfig
from ..files import atomic_write
from .checkpoint import CheckpointError

# Hugging Face `hidden_act` (transformers' ACT2FN names) -> vitkit's act_layer. 'gelu_new' is
# the tanh formula written out: equal to PyTorch's tanh GELU up to float rounding.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
}

# transformers' processor that runs timm's eval transform from a `pretrained_cfg`.
HF_PROCESSOR = "TimmWrapperImageProcessor"


def hf_config_dict(config: Any) -> dict[str, Any]:
    """A Hugging Face config (a `config.json` path, a dict or a transformers config) as a
    dict; {} for None."""
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        try:
            values = json.loads(Path(config).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise CheckpointError(
                f"cannot read the Hugging Face config {config} ({err}); it should be the "
                "model's config.json"
            ) from None
        if not isinstance(values, dict):
            raise CheckpointError(
                f"the Hugging Face config {config} is not a JSON object; it should be the "
                "model's config.json"
            )
        return values
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def unknown_weights_error(keys: Mapping[str, Any], supported: str) -> CheckpointError:
    """The one-line error for Hugging Face weights no rule maps: the first keys, and the models
    that are read."""
    names = sorted(keys)
    return CheckpointError(
        f"Hugging Face weights not understood: {', '.join(names[:5])}"
        + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
        + f"; only {supported} weights are supported"
    )


def hf_processor(data_config: DataConfig) -> dict[str, Any]:
    """The `preprocessor_config.json` with which transformers' `AutoImageProcessor` prepares
    images exactly as `data_config` says: `TimmWrapperImageProcessor` (transformers 4.48 or
    newer; loading it needs timm, the model does not) with the data config as timm's
    `pretrained_cfg`."""
    return {"image_processor_type": HF_PROCESSOR, "pretrained_cfg": data_config.to_dict()}


def class_names(model: nn.Module) -> list[str]:
    """The model's class names (`meta`), else Hugging Face's `LABEL_i`."""
    names = getattr(model, "meta", {}).get("class_names")
    count = model.config.num_classes
    return list(names) if names and len(names) == count else [f"LABEL_{i}" for i in range(count)]


def write_json(path: Path, values: dict[str, Any]) -> None:
    """`values` as an indented JSON file, written atomically."""
    text = json.dumps(values, indent=2) + "\n"
    atomic_write(path, lambda f: f.write(text), mode="w")


def model_data_config(model: nn.Module) -> DataConfig:
    """The data config the model was given, else the one of its timm `pretrained_cfg`."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    cfg = model.pretrained_cfg
    return DataConfig(
        input_size=cfg["input_size"],
        interpolation=cfg["interpolation"],
        crop_pct=cfg["crop_pct"],
        mean=cfg["mean"],
        std=cfg["std"],
    )


def write_hf_folder(
    folder: Path,
    model: nn.Module,
    config: dict[str, Any],
    tensors: Mapping[str, Tensor],
    data_config: DataConfig,
) -> Path:
    """`config.json` (`config` with the model's class names), `model.safetensors` and the
    `preprocessor_config.json` of `data_config`: a folder transformers loads.

    Args:
        folder: where to write (created).
        model: the model written, for its class names.
        config: the Hugging Face config fields.
        tensors: the weights under transformers' names.
        data_config: how its inputs are prepared.
    """
    names = class_names(model)
    config = {
        **config,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }
    write_json(folder / "config.json", config)
    data = serialize_safetensors(dict(tensors), metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    write_json(folder / "preprocessor_config.json", hf_processor(data_config))
    return folder
