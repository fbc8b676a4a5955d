"""What `load_pretrained` read of a source (`SourceWeights`) and how it fits the weights to the
model they go into (`Fitting`): the two values a family's `fill` (`weights/families.py`) takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ..data.data_config import DataConfig


@dataclass(frozen=True, kw_only=True)
class Fitting:
    """How weights are fitted to the model they go into (None: as the weights are).

    Args:
        num_classes: a new head size; a head of another size is re-initialised.
        img_size: a new input size; the position grid is resampled to it.
        patch_size: a new patch size; the patch embedding is PI-resized (FlexiViT).
        distilled: add (or keep) a distillation token.
        pos_resample: whose grid resampling to follow (`POS_RESAMPLE_MODES`).
    """

    num_classes: int | None = None
    img_size: int | tuple[int, int] | None = None
    patch_size: int | tuple[int, int] | None = None
    distilled: bool | None = None
    pos_resample: str = "timm"


@dataclass(frozen=True)
class SourceWeights:
    """Weights read and converted to vitkit's layout: the state dict, its config (of its
    family's config class), its format, the data config and the class names its source states
    (None: none)."""

    state_dict: dict[str, Tensor]
    config: Any
    format: str
    data_config: DataConfig | None
    name: str
    class_names: tuple[str, ...] | None = None
