"""`load_pretrained` for SAM ViT weights: the model they go into, holding them.

Fine-tuning at another resolution resamples the absolute position map (bicubic, antialiased:
timm's `resample_abs_pos_embed_nhwc`) and linearly interpolates the global blocks'
relative-position tables to the new grid (2 * grid - 1 rows, as timm's `get_rel_pos` reads a
table at another size; window blocks' tables keep the window's). A new patch size PI-resizes
the patch kernel (FlexiViT); a new number of classes gets a fresh head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model.layers.pos_embed import resample_pos_embed
from ...model.layers.window import resize_rel_pos
from ...model.sam import SamConfig, SamViT
from ..fitting import fill_model, fit_patch_kernel, fresh_head
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.fc.weight", "head.fc.bias")


def fill_sam(
    weights: SourceWeights, model: SamViT | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> SamViT:
    """`fill_model` (`weights/fitting.py`) with this family's fitting of the weights."""
    return fill_model(weights, model, fitting, overrides, title="SAM ViT", fit=fitted_state_dict)


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: SamConfig, model: SamViT
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: a fresh head for another class count, the
    patch kernel PI-resized, the position map resampled and the global relative-position
    tables interpolated to its grid."""
    own = model.state_dict()
    fresh_head(state_dict, own, (model.num_classes, source.num_classes), _HEAD_KEYS)
    fit_patch_kernel(state_dict, own)
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if old_grid == new_grid:
        return state_dict
    log.info("resampling the positions from grid %s to %s", old_grid, new_grid)
    if "pos_embed" in state_dict:
        dim = state_dict["pos_embed"].shape[-1]
        flat = state_dict["pos_embed"].reshape(1, -1, dim)  # (1, h * w, D)
        flat = resample_pos_embed(flat, new_grid, old_grid, num_prefix_tokens=0)
        state_dict["pos_embed"] = flat.reshape(1, *new_grid, dim)  # (1, h', w', D)
    for key, table in list(state_dict.items()):
        if key.endswith((".rel_pos_h", ".rel_pos_w")):
            state_dict[key] = resize_rel_pos(table, own[key].shape[0])
    return state_dict
