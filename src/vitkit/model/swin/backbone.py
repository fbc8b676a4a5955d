"""The Swin as a dense-prediction backbone: its four stages give maps at strides 4, 8, 16 and
32 (an FPN's input), all four by default, as timm's."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from ..features import ViTBackbone


class SwinBackbone(ViTBackbone):
    """`features_only` wrapper of a `SwinTransformer`: images -> the maps of stages
    `out_indices` (default: all, as timm), (B, C_i, H/r_i, W/r_i) for 'NCHW' or timm's own
    `features_only` layout (B, H/r_i, W/r_i, C_i) for 'NHWC'; `norm` applies the final norm to
    the last stage's map (the only one it is sized for); `stage_norm_eps` adds a LayerNorm of
    that epsilon to each map (`stage_norms`, in `out_indices` order: transformers'
    `SwinBackbone.hidden_states_norms`). Other arguments as `ViTBackbone`."""

    OUTPUT_FMTS = ("NCHW", "NHWC")

    def __init__(
        self,
        model: nn.Module,
        out_indices: int | Sequence[int] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NCHW",
        prune: bool = False,
        stage_norm_eps: float | None = None,
    ) -> None:
        super().__init__(model, out_indices, norm=norm, output_fmt=output_fmt, prune=prune)
        self.stage_norms: nn.ModuleList | None = None
        if stage_norm_eps is not None:
            norms = [nn.LayerNorm(chans, eps=stage_norm_eps) for chans in self.channels]
            self.stage_norms = nn.ModuleList(norms)

    def forward(self, x: Tensor) -> list[Tensor]:
        if self.stage_norms is None:
            return super().forward(x)
        maps = self.model.forward_intermediates(
            x,
            self.out_indices,
            norm=self.norm,
            output_fmt="NHWC",
            intermediates_only=True,
            stop_early=True,
        )
        maps = [norm(m) for norm, m in zip(self.stage_norms, maps)]  # each (B, H_i, W_i, C_i)
        if self.output_fmt == "NCHW":
            maps = [m.permute(0, 3, 1, 2).contiguous() for m in maps]  # (B, C_i, H_i, W_i)
        return maps

    @staticmethod
    def default_out_indices(depth: int) -> list[int]:
        return list(range(depth))
