"""BEiT weights out as other libraries' folders: a Hugging Face folder
(`BeitForImageClassification`, or `BeitModel` without a head) and a timm Hub-style folder, each
loaded by that library as the same model.

The Hugging Face folder has the Hub file names `hf.py` reads and the data config as
`preprocessor_config.json` (as the ViT's, `weights/vit/folders.py`); what Hugging Face's Beit
cannot express is refused in one line (`hf.hf_beit_problems`). The timm folder (`config.json`
with the architecture, `model_args` and `pretrained_cfg`, and `model.safetensors`) is what
`timm.create_model("local-dir:" + folder, pretrained=True)` loads, its keys being timm's. timm's
`Beit` takes every option as a JSON argument but the norm epsilon (its LayerNorm's 1e-6):
another is refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from safetensors.torch import save as serialize_safetensors

from ...files import atomic_write
from ...model.beit import Beit, BeitConfig
from ..hub import class_names, model_data_config, write_hf_folder, write_json
from .hf import to_hf_beit, to_hf_beit_config

TIMM_EPS = 1e-6  # timm's LayerNorm, which `beit.py` builds every norm with
_ARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_ratio", "qkv_bias", "swiglu_mlp", "scale_mlp", "init_values", "use_abs_pos_emb",
    "use_rel_pos_bias", "use_shared_rel_pos_bias", "head_init_scale", "use_fc_norm",
)  # fmt: skip


def timm_beit_args(config: BeitConfig) -> tuple[str, dict[str, Any]]:
    """timm's architecture name and the `Beit` arguments over its factory's that build
    `config` (every argument, so the factory's own fixed values do not count)."""
    if config.norm_eps != TIMM_EPS:
        raise ValueError(
            f"timm's Beit has LayerNorm epsilon {TIMM_EPS:g}, this model {config.norm_eps:g}; "
            "a timm folder would not be the same model: export --format onnx, or keep vitkit's "
            "own checkpoint (vitkit.save)"
        )
    args = {name: getattr(config, name) for name in _ARGS}
    if isinstance(config.img_size, tuple):
        args["img_size"] = list(config.img_size)
    args["global_pool"] = "" if config.global_pool == "none" else config.global_pool
    return "beit_base_patch16_224", args


def save_timm_beit_folder(model: Beit, folder: str | os.PathLike) -> Path:
    """`config.json` (architecture, model_args, pretrained_cfg) and `model.safetensors` that
    `timm.create_model("local-dir:" + folder, pretrained=True)` loads as the same model."""
    folder = Path(folder)
    architecture, model_args = timm_beit_args(model.config)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    pretrained_cfg = {
        **model_data_config(model).to_dict(),
        "num_classes": model.config.num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "fixed_input_size": True,
        "label_names": class_names(model),
    }
    config = {
        "architecture": architecture,
        "num_classes": model.config.num_classes,
        "num_features": model.config.embed_dim,
        "global_pool": model_args["global_pool"],
        "model_args": model_args,
        "pretrained_cfg": pretrained_cfg,
    }
    write_json(folder / "config.json", config)
    data = serialize_safetensors(tensors, metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    return folder


def save_hf_beit_folder(model: Beit, folder: str | os.PathLike) -> Path:
    """`config.json`, `model.safetensors` and `preprocessor_config.json` that transformers
    loads as the same model (`BeitForImageClassification`, or `BeitModel` without a head);
    refused before anything is written where Hugging Face's Beit cannot express the model."""
    state_dict = model.state_dict()
    head = model.config.num_classes > 0
    try:
        config = to_hf_beit_config(model.config, state_dict["blocks.0.mlp.fc1.weight"].shape[0])
    except ValueError as err:
        raise ValueError(f"{err}; {_elsewhere(model.config)}") from None
    config["architectures"] = ["BeitForImageClassification" if head else "BeitModel"]
    tensors = to_hf_beit(state_dict, head)
    return write_hf_folder(Path(folder), model, config, tensors, model_data_config(model))


def _elsewhere(config: BeitConfig) -> str:
    """Where a model Hugging Face's Beit cannot hold can go instead."""
    try:
        timm_beit_args(config)
    except ValueError:
        return "export --format onnx, or keep vitkit's own checkpoint (vitkit.save)"
    return "export --format timm instead (or keep vitkit's own checkpoint)"
