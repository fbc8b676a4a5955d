"""What the weights registry (`weights/families.py`) asks of the ViT's weights: the key
patterns that tell its weights in each source layout, the readers that take the reading options
every source is given and pass each converter what it reads, and the options a name, a timm
folder or a given model states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ...model import ViTConfig
from ...model.vit.torch_encoder import torch_to_native_state_dict
from .folders import timm_folder_options
from .hf_families import from_hf_any
from .jax import from_jax
from .layout import MBCONV_PROJ
from .timm import arch_options, from_timm
from .torchvision import TORCHVISION_BUILDERS, from_torchvision

# Reading options that are the Swin's (its weights do not record the image size).
_OTHERS = ("fit_img_size", "folder_img_size")


# -- the keys of each layout (timm `vision_transformer.py` and vitkit, Hugging Face
# `modeling_vit.py` / `modeling_dinov2.py` / CLIP / SigLIP / VitDet, torchvision
# `vision_transformer.py`, the npz files of google-research/vision_transformer and big_vision)


def timm_keys(keys: Sequence[str]) -> bool:
    """The patch projection, or the convolution of ViTamin's stem that stands for it."""
    return any(k.removeprefix("module.") in ("patch_embed.proj.weight", MBCONV_PROJ) for k in keys)


def hf_keys(keys: Sequence[str]) -> bool:
    return any(
        "embeddings.patch_embeddings.projection" in k
        or k.endswith(("embeddings.patch_embedding.weight", "embeddings.projection.weight"))
        for k in keys
    )


def torchvision_keys(keys: Sequence[str]) -> bool:
    return any(
        k in ("conv_proj.weight", "class_token") or k.startswith("encoder.layers.encoder_layer_")
        for k in keys
    )


def jax_keys(keys: Sequence[str]) -> bool:
    return any(k.endswith("embedding/kernel") for k in keys)


# -- the readers: each source's converter, given the options every source is given -----------


def _own(options: dict[str, Any]) -> dict[str, Any]:
    for name in _OTHERS:
        options.pop(name, None)
    return options


def read_timm(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, ViTConfig]:
    return from_timm(state_dict, **_own(options))


def read_hf(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, ViTConfig]:
    return from_hf_any(state_dict, **_own(options))


def read_torchvision(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, ViTConfig]:
    return from_torchvision(state_dict, **_own(options))


def read_jax(state_dict: Mapping[str, Any], **options: Any) -> tuple[dict, ViTConfig]:
    return from_jax(state_dict, **_own(options))


# -- what a name, a folder or a model states --------------------------------------------------


def named_options(format: str, options: dict[str, Any]) -> dict[str, Any]:
    """`arch` is read by the timm and JAX converters; for the others it gives the options the
    name states (`timm.arch_options`), under the given ones."""
    if format in ("hf", "torchvision") and "arch" in options:
        return {**arch_options(options.pop("arch")), **options}
    return options


def folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """A timm folder's `model_args` as `from_timm`'s options; its img_size is kept apart
    (`folder_img_size`) for a Swin's weights under a name vitkit does not know."""
    options = timm_folder_options(model_args)
    if "img_size" in model_args:
        options["folder_img_size"] = model_args["img_size"]
    return options


def builders() -> dict[str, dict[str, Any]]:
    """torchvision's builder names (`vit_b_16`, ...) -> the head count each stands for."""
    return {name: {"num_heads": sizes[2]} for name, sizes in TORCHVISION_BUILDERS.items()}


def model_reading(model: nn.Module, format: str) -> dict[str, Any]:
    """A given model knows its head count (JAX weights record theirs)."""
    return {} if format == "jax" else {"num_heads": model.config.num_heads}


def native_keys(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A vitkit `encoder='torch'` state dict's block keys renamed to the native blocks'."""
    if any(k.startswith("blocks.layers.") for k in state_dict):
        return torch_to_native_state_dict(state_dict)
    return state_dict
