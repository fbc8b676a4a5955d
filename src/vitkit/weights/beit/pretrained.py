"""`load_pretrained` for BEiT weights: the model they go into, holding them, fitted as timm's
`checkpoint_filter_fn` fits them.

Fine-tuning at another resolution resamples the absolute position table where the model has
one (bicubic, antialiased, the class token kept apart: timm's `resample_abs_pos_embed`) and
resizes every relative position table to the new grid (BEiT's geometric resize:
layers/rel_pos_bias.py); a new patch size PI-resizes the patch kernel (FlexiViT); a new number
of classes gets a freshly initialised head. Weights with one shared table going into a model
with a table per block (an original pre-training checkpoint fine-tuned, as BEiT's fine-tuning
code does it) give each block a copy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model.beit import Beit, BeitConfig
from ...model.layers.pos_embed import resample_pos_embed
from ...model.layers.rel_pos_bias import CLASS_ROWS, resize_rel_pos_bias_table
from ..fitting import fill_model, fit_patch_kernel, fresh_head
from ..source import Fitting, SourceWeights
from .timm import SHARED_TABLE

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias")
_TABLE = "relative_position_bias_table"


def fill_beit(
    weights: SourceWeights, model: Beit | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> Beit:
    """`fill_model` (`weights/fitting.py`) with this family's fitting of the weights."""
    return fill_model(weights, model, fitting, overrides, title="BEiT", fit=fitted_state_dict)


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: BeitConfig, model: Beit
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: its own fresh head for another class count,
    the patch kernel PI-resized to its patch size, the position table resampled to its grid,
    a shared table copied to each block that has its own, every table resized to its grid."""
    own = model.state_dict()
    fresh_head(state_dict, own, (model.num_classes, source.num_classes), _HEAD_KEYS)
    fit_patch_kernel(state_dict, own)
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if "pos_embed" in state_dict and old_grid != new_grid:
        log.info("resampling the position embedding from grid %s to %s", old_grid, new_grid)
        state_dict["pos_embed"] = resample_pos_embed(
            state_dict["pos_embed"], new_size=new_grid, old_size=old_grid, num_prefix_tokens=1
        )
    _share_out(state_dict, own)
    for key in [k for k in state_dict if k.endswith(_TABLE)]:
        if key in own and state_dict[key].shape != own[key].shape:
            state_dict[key] = resize_rel_pos_bias_table(
                state_dict[key], new_grid, old_grid, extra_rows=CLASS_ROWS
            )
    return state_dict


def _share_out(state_dict: dict[str, Tensor], own: Mapping[str, Tensor]) -> None:
    """A shared table, where the model has a table per block and none shared, copied to each
    block (BEiT's fine-tuning of a pre-trained checkpoint)."""
    if SHARED_TABLE not in state_dict or SHARED_TABLE in own:
        return
    blocks = [k for k in own if k.startswith("blocks.") and k.endswith(_TABLE)]
    if not blocks:
        return
    log.info("copying the shared relative position table to each of %d blocks", len(blocks))
    shared = state_dict.pop(SHARED_TABLE)
    for key in blocks:
        state_dict[key] = shared.clone()
