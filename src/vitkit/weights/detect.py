"""Which library a checkpoint comes from, its converter, and where a hub folder keeps it.

The format is told from the key names: timm `vision_transformer.py` (and vitkit) name the
patch projection `patch_embed.proj`, Hugging Face `modeling_vit.py` and `modeling_dinov2.py`
`embeddings.patch_embeddings.projection` (CLIP's and SigLIP's `embeddings.patch_embedding`,
VitDet's `embeddings.projection`),
torchvision `vision_transformer.py` `conv_proj`, and the npz files of
google-research/vision_transformer and big_vision `embedding/kernel` (also under `params/img/`).
Hugging Face's families (ViT, DINOv2, CLIP, SigLIP, VitDet) are one format, 'hf', whose
converter tells them apart (`hf_families.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from ..model import ViTConfig
from .checkpoint import CheckpointError
from .jax import from_jax
from .swin import from_timm_or_swin
from .swin_hf import from_hf_or_swin
from .swin_torchvision import from_torchvision_or_swin

FORMATS = ("vitkit", "timm", "hf", "torchvision", "jax")

# The weights file of a Hugging Face `save_pretrained` / Hub folder (timm's Hub folders too),
# in order of preference.
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")

CONVERTERS: dict[str, Callable[..., tuple[dict[str, Tensor], ViTConfig]]] = {
    "timm": from_timm_or_swin,  # a ViT's or a Swin's keys (swin.py)
    "vitkit": from_timm_or_swin,
    "hf": from_hf_or_swin,  # a ViT family's or a Swin's keys (swin_hf.py)
    "torchvision": from_torchvision_or_swin,  # a ViT's or a Swin's (swin_torchvision.py)
    "jax": from_jax,
}


def detect_format(state_dict: Mapping[str, Any]) -> str:
    """'timm' (also vitkit's own keys), 'hf', 'torchvision' or 'jax', from the key names."""
    keys = list(state_dict)
    if any(k.endswith("embedding/kernel") for k in keys):
        return "jax"
    if any(
        k in ("conv_proj.weight", "class_token", "features.0.0.weight")
        or k.startswith("encoder.layers.encoder_layer_")
        for k in keys
    ):
        return "torchvision"
    if any(
        "embeddings.patch_embeddings.projection" in k
        or k.endswith(("embeddings.patch_embedding.weight", "embeddings.projection.weight"))
        for k in keys
    ):
        return "hf"
    if any(k.removeprefix("module.") == "patch_embed.proj.weight" for k in keys):
        return "timm"
    raise CheckpointError(
        f"cannot tell the checkpoint format from its keys ({', '.join(keys[:4])}, ...); it is "
        f"none of {', '.join(FORMATS)}: pass format= if it is one of them"
    )


def weights_file(path: str | os.PathLike) -> Path:
    """The weights file of `path`: `model.safetensors` (else `pytorch_model.bin`) inside a
    Hugging Face / timm hub folder, or `path` itself when it is not a folder.

    A folder holding neither raises a CheckpointError; a missing file is left for the loader
    to report.
    """
    path = Path(path)
    if not path.is_dir():
        return path
    for name in WEIGHTS_FILES:
        if (path / name).is_file():
            return path / name
    raise CheckpointError(
        f"{path} is a folder without {' or '.join(WEIGHTS_FILES)}; pass a weights file"
    )
