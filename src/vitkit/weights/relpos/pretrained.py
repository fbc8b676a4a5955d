"""`load_pretrained` for relative-position ViT weights: the model they go into, holding them.

Fine-tuning at another resolution needs nothing of the weights: the bias MLP computes the bias of
any patch grid from its offsets (Swin V2's continuous position bias), as timm's `set_input_size`
does. A new patch size PI-resizes the patch kernel (FlexiViT); a new number of classes gets a
fresh head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model.relpos import RelPosConfig, RelPosViT
from ..fitting import fill_model, fit_patch_kernel, fresh_head
from ..source import Fitting, SourceWeights

_HEAD_KEYS = ("head.weight", "head.bias")


def fill_relpos(
    weights: SourceWeights, model: RelPosViT | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> RelPosViT:
    """`fill_model` (`weights/fitting.py`) with this family's fitting of the weights."""
    return fill_model(
        weights, model, fitting, overrides, title="relative-position ViT", fit=fitted_state_dict
    )


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: RelPosConfig, model: RelPosViT
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: a fresh head for another class count, the
    patch kernel PI-resized."""
    own = model.state_dict()
    fresh_head(state_dict, own, (model.num_classes, source.num_classes), _HEAD_KEYS)
    fit_patch_kernel(state_dict, own)
    return state_dict
