"""How images are prepared for a model's weights: the data config that travels with them.

Weights are only right on the input distribution they were trained on, so the preparation is
part of the weights: input size, interpolation, the resize-then-centre-crop ratio `crop_pct`,
and the per-channel mean and std. The fields and their meaning are timm's
(`timm.data.resolve_data_config`): evaluation resizes to `img_size / crop_pct` and crops the
centre `img_size` (`crop_mode='center'`), or resizes straight to `img_size` (`'squash'`).

vitkit stores it in every checkpoint's metadata (`meta['data_config']`), reads it from the
source of converted weights (`weights/preprocessing.py`), and `predict`, `eval`, `explain`,
`export` and fine-tuning use it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
CROP_MODES = ("center", "squash")

# The normalisations of the published ViT weights (timm.data.constants).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The preparation of an image for one model's weights (timm's data-config fields).

    Args:
        input_size: (channels, height, width) the model takes.
        mean, std: per-channel normalisation of pixels in [0, 1].
        interpolation: the resize filter ('nearest', 'bilinear', 'bicubic', 'lanczos').
        crop_pct: evaluation resizes to `size / crop_pct`, then crops the centre `size`
            (1.0: no margin).
        crop_mode: 'center' (resize the shorter side, centre crop) or 'squash' (resize both
            sides to the input size, no crop).
    """

    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bicubic"
    crop_pct: float = 1.0
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        size = tuple(self.input_size)
        if len(size) != 3 or not all(_is_int(v) and 1 <= v <= 65536 for v in size):
            raise ValueError(
                f"input_size must be (channels, height, width) of positive ints, got "
                f"{self.input_size!r}"
            )
        object.__setattr__(self, "input_size", size)
        for name in ("mean", "std"):
            values = getattr(self, name)
            if isinstance(values, (int, float)) and not isinstance(values, bool):
                values = (values,) * size[0]  # one value for every channel
            values = tuple(values) if isinstance(values, Sequence) else (values,)
            if len(values) != size[0] or not all(_is_number(v) for v in values):
                raise ValueError(
                    f"{name} must be {size[0]} finite numbers (one per channel), got "
                    f"{getattr(self, name)!r}"
                )
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if not all(v > 0 for v in self.std):
            raise ValueError(f"std must be > 0 for every channel, got {self.std}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"unknown interpolation {self.interpolation!r}; expected one of "
                f"{', '.join(INTERPOLATIONS)}"
            )
        if not (_is_number(self.crop_pct) and 0 < self.crop_pct <= 1):
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct!r}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(
                f"unknown crop_mode {self.crop_mode!r}; expected one of {', '.join(CROP_MODES)}"
            )

    @property
    def img_size(self) -> tuple[int, int]:
        """(height, width) of the model's input."""
        return self.input_size[1], self.input_size[2]

    def replace(self, **changes: Any) -> DataConfig:
        """A copy with `changes` (validated); None values are ignored, so flags that were not
        given leave the config as it is."""
        given = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **given)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, timm's key names."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "data config") -> DataConfig:
        """From `to_dict` output or timm's `pretrained_cfg` (other keys of which are ignored);
        one ValueError naming `source` when it is unusable."""
        if not isinstance(values, Mapping):
            raise ValueError(f"{source} must be a JSON object, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"input_size", "mean", "std"} - set(values)
        if missing:
            raise ValueError(f"{source} lacks {', '.join(sorted(missing))}")
        try:
            return cls(**{k: v for k, v in values.items() if k in names})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
