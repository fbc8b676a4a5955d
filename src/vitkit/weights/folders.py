"""Weights out as the folders other libraries load: a Hugging Face model folder
(`ViTForImageClassification.from_pretrained(dir)`, `AutoImageProcessor.from_pretrained(dir)`)
and a timm Hub-style folder (`timm.create_model("local-dir:" + dir, pretrained=True)`).

Each folder carries the model's data config the way that library reads it: timm's
`pretrained_cfg` in `config.json`; for Hugging Face a `preprocessor_config.json` of
`ViTImageProcessor` (resize both sides: vitkit's 'squash') or of `CLIPImageProcessor`
(shortest edge to `size / crop_pct`, then the centre crop: timm's and vitkit's 'center').
Files are written atomically; the folder is created.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from safetensors.torch import save as serialize_safetensors

from ..data.data_config import DataConfig
from ..files import atomic_write
from ..model import VisionTransformer
from ..model.config import to_2tuple
from .hf import to_hf, to_hf_config
from .timm import timm_kwargs, to_timm

# PIL's resample codes, which Hugging Face processors store.
_PIL_CODES = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3}


def save_hf_folder(model: VisionTransformer, folder: str | os.PathLike) -> Path:
    """`config.json`, `model.safetensors` and `preprocessor_config.json` that transformers
    loads as the same model (`ViTForImageClassification`, or `ViTModel` without a head)."""
    folder = Path(folder)
    config = to_hf_config(model.config)  # refuses what HF's ViT cannot express
    names = _class_names(model)
    head = model.config.num_classes > 0
    config.update(
        model_type="vit",
        architectures=["ViTForImageClassification" if head else "ViTModel"],
        id2label={str(i): name for i, name in enumerate(names)},
        label2id={name: i for i, name in enumerate(names)},
    )
    tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf(model).items()}
    _write_json(folder / "config.json", config)
    data = serialize_safetensors(tensors, metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    _write_json(folder / "preprocessor_config.json", hf_processor(_data_config(model)))
    return folder


def hf_processor(data_config: DataConfig) -> dict[str, Any]:
    """The Hugging Face image-processor settings that prepare images as `data_config` says."""
    height, width = data_config.img_size
    common = {
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(data_config.mean),
        "image_std": list(data_config.std),
        "resample": _PIL_CODES[data_config.interpolation],
    }
    if data_config.crop_mode == "squash":
        size = {"height": height, "width": width}
        return {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": size,
                **common}  # fmt: skip
    if height != width:
        raise ValueError(
            f"a centre crop to a non-square {height}x{width} input has no Hugging Face image "
            "processor; export a model with a square input or crop_mode='squash'"
        )
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": math.floor(height / data_config.crop_pct)},
        "do_center_crop": True,
        "crop_size": {"height": height, "width": width},
        "do_convert_rgb": data_config.input_size[0] == 3,
        **common,
    }


def save_timm_folder(model: VisionTransformer, folder: str | os.PathLike) -> Path:
    """`config.json` (architecture, model_args, pretrained_cfg) and `model.safetensors` that
    `timm.create_model("local-dir:" + folder, pretrained=True)` loads as the same model."""
    folder = Path(folder)
    if model.config.norm_eps != 1e-6:
        raise ValueError(
            f"timm's ViT uses LayerNorm eps 1e-6; this model uses {model.config.norm_eps:g}, "
            "so timm would compute another function"
        )
    if model.config.embed_norm:
        raise ValueError("a timm config.json cannot name a patch-embedding norm (embed_norm)")
    kwargs = {  # JSON values only: the norm layer is timm's default (eps 1e-6)
        k: list(v) if isinstance(v, tuple) else v
        for k, v in timm_kwargs(model.config).items()
        if k != "norm_layer"
    }
    data_config = _data_config(model)
    pretrained_cfg = {
        **data_config.to_dict(),
        "num_classes": model.config.num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "fixed_input_size": not model.config.dynamic_img_size,
        "label_names": _class_names(model),
    }
    architecture = (
        "vit_base_patch16_224" if not model.config.distilled else "deit_base_distilled_patch16_224"
    )
    config = {
        "architecture": architecture,
        "num_classes": model.config.num_classes,
        "num_features": model.config.embed_dim,
        "global_pool": model.config.global_pool,
        "model_args": kwargs,
        "pretrained_cfg": pretrained_cfg,
    }
    tensors = {k: v.detach().contiguous().cpu() for k, v in to_timm(model).items()}
    _write_json(folder / "config.json", config)
    data = serialize_safetensors(tensors, metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    return folder


def _data_config(model: VisionTransformer) -> DataConfig:
    """The model's data config, or timm's ViT default (0.5 / 0.5, bicubic, 0.9)."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    height, width = to_2tuple(model.config.img_size, "img_size")
    chans = model.config.in_chans
    return DataConfig(input_size=(chans, height, width), mean=0.5, std=0.5, crop_pct=0.9)


def _class_names(model: VisionTransformer) -> list[str]:
    names = getattr(model, "meta", {}).get("class_names")
    count = model.config.num_classes
    return list(names) if names and len(names) == count else [f"LABEL_{i}" for i in range(count)]


def _write_json(path: Path, values: dict[str, Any]) -> None:
    text = json.dumps(values, indent=2) + "\n"
    atomic_write(path, lambda f: f.write(text), mode="w")
