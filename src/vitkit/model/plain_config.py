"""`PlainViTConfig`: the options every plain-ViT family (BEiT, EVA, SAM, the relative-position
ViT: one list of blocks over one patch grid) declares alike, stated once: the model's sizes, its
head's outputs and its dropout rates, with timm's ViT-B/16 defaults, and the checks on them.

A family's config adds its own options and overrides a field where its default or meaning differs
(SAM's 1024 x 1024 input, its headless default). The ViT's `ViTConfig` is not one of them: its
patch size may be H W, and its options carry more (`family=True`, conv stems).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import FRACTION, POSITIVE, Options, Range, option
from .layers.patch_embed import patch_grid, to_2tuple

SIDE = Range(1, 65536)


@dataclass(frozen=True, kw_only=True)
class PlainViTConfig(Options):
    """The options shared by the plain-ViT families' configs; defaults are a ViT-B/16 at 224 with
    a 1000-class head and no dropout."""

    NOUN = "model option"
    GROUPS = {
        "shape": "model shape (default: the preset's)",
        "regularisation": "model regularisation (default: the preset's)",
        "architecture": "model architecture (default: the preset's)",
    }

    img_size: int | tuple[int, int] = option(
        224, "input size: N or H W", range=SIDE, metavar="N", group="shape"
    )
    patch_size: int = option(16, "patch size", range=SIDE, group="shape")
    in_chans: int = option(3, "input channels", range=Range(1, 4096), group="shape")
    num_classes: int = option(
        1000, "head outputs; 0: pooled features only", range=Range(0, 10_000_000), group="shape"
    )
    embed_dim: int = option(768, "token width D", range=SIDE, group="shape")
    depth: int = option(12, "number of blocks", range=Range(1, 1024), group="shape")
    num_heads: int = option(12, "attention heads; must divide embed_dim", range=SIDE,
                            group="shape")  # fmt: skip
    mlp_ratio: float = option(4.0, "MLP hidden width as a multiple of embed_dim",
                              range=POSITIVE, group="shape")  # fmt: skip
    drop_rate: float = option(0.0, "dropout before the head", range=FRACTION,
                              group="regularisation")  # fmt: skip
    proj_drop_rate: float = option(0.0, "dropout after the attention projection and the MLP",
                                   range=FRACTION, group="regularisation")  # fmt: skip
    attn_drop_rate: float = option(0.0, "dropout on the attention weights", range=FRACTION,
                                   group="regularisation")  # fmt: skip
    drop_path_rate: float = option(
        0.0, "stochastic depth at the last block, rising linearly from 0 at the first",
        range=FRACTION, group="regularisation",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                f"choose num_heads among the divisors of {self.embed_dim}"
            )
        self.grid_size  # noqa: B018 (checks img_size against patch_size)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at `img_size`."""
        size = to_2tuple(self.img_size, "img_size")
        return patch_grid(*size, (self.patch_size, self.patch_size), 0, "img_size")
