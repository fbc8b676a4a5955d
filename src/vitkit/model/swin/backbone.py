"""The Swin as a dense-prediction backbone: its four stages give maps at strides 4, 8, 16 and
32 (an FPN's input), all four by default, as timm's."""

from __future__ import annotations

from ..features import ViTBackbone


class SwinBackbone(ViTBackbone):
    """`features_only` wrapper of a `SwinTransformer`: images -> the maps of stages
    `out_indices` (default: all, as timm), (B, C_i, H/r_i, W/r_i) for 'NCHW' or timm's own
    `features_only` layout (B, H/r_i, W/r_i, C_i) for 'NHWC'; `norm` applies the final norm to
    the last stage's map (the only one it is sized for). Other arguments as `ViTBackbone`."""

    OUTPUT_FMTS = ("NCHW", "NHWC")

    @staticmethod
    def default_out_indices(depth: int) -> list[int]:
        return list(range(depth))
