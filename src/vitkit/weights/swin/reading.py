"""What the weights registry (`weights/families.py`) asks of the Swin's weights (V1, V2 and
timm's V2-cr): the key patterns that tell them in each source layout and the readers that take
the reading options every source is given. A Swin's weights do not record the image size:
`fit_img_size` (`load_pretrained`'s img_size) and `folder_img_size` (a timm folder's
`model_args`) give it where no name does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...model import SwinConfig, SwinTransformer
from ..source import Fitting, SourceWeights
from .folders import swin_folder_options
from .hf import from_hf_swin, is_hf_swin
from .timm import fill_swin, from_timm_swin, is_swin_state_dict
from .torchvision import (
    TORCHVISION_SWIN,
    from_torchvision_swin,
    is_torchvision_swin,
    torchvision_data_config,
)


def timm_keys(keys: Sequence[str]) -> bool:
    return is_swin_state_dict(list(keys))


def hf_keys(keys: Sequence[str]) -> bool:
    return is_hf_swin(list(keys))


def torchvision_keys(keys: Sequence[str]) -> bool:
    """torchvision's Swin (`features.0.0` the patch embedding, `features.1.0.attn` a block)."""
    return "features.0.0.weight" in keys or is_torchvision_swin(list(keys))


def read_timm(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, SwinConfig]:
    """`from_timm_swin`; a timm folder's img_size comes before its architecture's, and
    `load_pretrained`'s img_size reads weights of no name (any size reads them: it sets only
    the windows' clamping and masks)."""
    fit_img_size = options.pop("fit_img_size", None)
    folder_img_size = options.pop("folder_img_size", None)
    if fit_img_size is not None and options.get("arch") is None:
        options.setdefault("img_size", fit_img_size)
    if folder_img_size is not None:
        options.setdefault("img_size", folder_img_size)
    return from_timm_swin(state_dict, **options)


def read_hf(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, SwinConfig]:
    options.pop("new_head", None)  # a Swin's head is replaced by `fill_swin` in any case
    return from_hf_swin(state_dict, **options)


def read_torchvision(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, SwinConfig]:
    return from_torchvision_swin(state_dict, **options)


def folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    return swin_folder_options(model_args)


def builders() -> dict[str, dict[str, Any]]:
    """torchvision's builder names (`swin_t`, ...): `from_torchvision_swin` reads the name."""
    return {name: {"arch": name} for name in TORCHVISION_SWIN}


def fill(
    weights: SourceWeights,
    model: SwinTransformer | None,
    fitting: Fitting,
    overrides: Mapping[str, Any],
) -> SwinTransformer:
    """`fill_swin`, torchvision builders' weights given the eval transform of their weights
    (which a state dict does not carry) where nothing else states a data config."""
    if weights.format == "torchvision" and weights.data_config is None:
        data_config = torchvision_data_config(weights.config)
        if data_config is not None:
            weights = dataclasses.replace(weights, data_config=data_config)
    return fill_swin(weights, model, fitting, overrides)
