"""`load_pretrained` for EVA weights: the model they go into, holding them.

Fine-tuning at another resolution resamples the absolute position table where the model has
one (bicubic, antialiased, prefix tokens kept apart: timm's `resample_abs_pos_embed`, as its
`checkpoint_filter_fn` does); the rotary embedding follows the new patch grid by itself, scaled
to the pre-training grid (`ref_feat_shape`) as timm's. A new patch size PI-resizes the patch
kernel (FlexiViT); a new number of classes gets a freshly initialised head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model.eva import Eva, EvaConfig
from ...model.layers.pos_embed import resample_pos_embed
from ..fitting import fill_model, fit_patch_kernel, fresh_head
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias")


def fill_eva(
    weights: SourceWeights, model: Eva | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> Eva:
    """`fill_model` (`weights/fitting.py`) with this family's fitting of the weights."""
    return fill_model(weights, model, fitting, overrides, title="EVA", fit=fitted_state_dict)


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: EvaConfig, model: Eva
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: its own fresh head for another class count,
    the patch kernel PI-resized to its patch size, the position table resampled to its grid."""
    own = model.state_dict()
    fresh_head(state_dict, own, (model.num_classes, source.num_classes), _HEAD_KEYS)
    fit_patch_kernel(state_dict, own)
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if "pos_embed" in state_dict and old_grid != new_grid:
        log.info("resampling the position embedding from grid %s to %s", old_grid, new_grid)
        state_dict["pos_embed"] = resample_pos_embed(
            state_dict["pos_embed"],
            new_size=new_grid,
            old_size=old_grid,
            num_prefix_tokens=0 if source.no_embed_class else source.num_prefix_tokens,
        )
    return state_dict
