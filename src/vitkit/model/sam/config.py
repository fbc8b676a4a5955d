"""`SamConfig`: every choice that defines a model of timm's `vision_transformer_sam.py`, declared
once with `option()` as `ViTConfig` is. The names and defaults are timm's `VisionTransformerSAM`
arguments (its Segment Anything presets': the class's own `num_classes=768` is no preset's), so
timm's weights load key for key.

SAM is Kirillov et al., "Segment Anything" (ICCV 2023); its image encoder is ViTDet's backbone
(Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", ECCV 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Options, Range, option
from ..layers.patch_embed import patch_grid, to_2tuple

SAM_POOLS = ("avg", "max", "avgmax", "none")
_SIDE = Range(1, 65536)


@dataclass(frozen=True, kw_only=True)
class SamConfig(Options):
    """The architecture of a `SamViT`; defaults are timm's SAM ViT-B/16 image encoder (1024 x
    1024 input, 14 x 14 windows, decomposed relative positions, a 256-channel neck, no
    classifier)."""

    NOUN = "model option"
    GROUPS = {
        "shape": "model shape (default: the preset's)",
        "regularisation": "model regularisation (default: the preset's)",
        "architecture": "model architecture (default: the preset's)",
    }

    img_size: int | tuple[int, int] = option(
        1024, "input size: N or H W (other multiples of the patch size run too)",
        range=_SIDE, metavar="N", group="shape",
    )  # fmt: skip
    patch_size: int = option(16, "patch size", range=_SIDE, group="shape")
    in_chans: int = option(3, "input channels", range=Range(1, 4096), group="shape")
    num_classes: int = option(
        0, "head outputs; 0: the pooled neck features only", range=Range(0, 10_000_000),
        group="shape",
    )  # fmt: skip
    embed_dim: int = option(768, "token width D", range=_SIDE, group="shape")
    depth: int = option(12, "number of blocks", range=Range(1, 1024), group="shape")
    num_heads: int = option(12, "attention heads; must divide embed_dim", range=_SIDE,
                            group="shape")  # fmt: skip
    mlp_ratio: float = option(4.0, "MLP hidden width as a multiple of embed_dim",
                              range=POSITIVE, group="shape")  # fmt: skip
    qkv_bias: bool = option(True, "biases of the query, key and value projections",
                            group="architecture")  # fmt: skip
    qk_norm: bool = option(False, "normalise queries and keys per head", group="architecture")
    init_values: float | None = option(
        None, "LayerScale init (ls1, ls2); None: no LayerScale", range=Range(0),
        group="architecture",
    )  # fmt: skip
    pre_norm: bool = option(False, "a norm before the blocks (norm_pre); the patch projection "
                            "then has no bias", group="architecture")  # fmt: skip
    use_abs_pos: bool = option(True, "a learned absolute position map (1, H/p, W/p, D)",
                               group="architecture")  # fmt: skip
    use_rel_pos: bool = option(
        True, "decomposed relative positions on the attention scores (MViTv2): rel_pos_h / "
        "rel_pos_w per block, interpolated to other grids", group="architecture",
    )  # fmt: skip
    window_size: int = option(
        14, "window side in patches of every block but global_attn_indexes; 0: global "
        "attention everywhere", range=Range(0, 65536), group="architecture",
    )  # fmt: skip
    global_attn_indexes: tuple[int, ...] = option(
        (), "the blocks that attend over the whole grid (SAM ViT-B: 2 5 8 11); as timm's, an index "
        "past the last block selects none",
        range=Range(0, 1023), metavar="INDEX", group="architecture",
    )  # fmt: skip
    neck_chans: int = option(
        256, "channels of the neck (conv 1x1, LayerNorm2d, conv 3x3, LayerNorm2d); 0: no neck, "
        "a LayerNorm2d over the blocks' map instead", range=Range(0, 65536),
        group="architecture",
    )  # fmt: skip
    global_pool: str = option("avg", "pooling of the neck's map before the head ('none': the "
                              "map itself)", choices=SAM_POOLS, group="architecture")  # fmt: skip
    norm_eps: float = option(1e-5, "epsilon of the blocks' norms (the neck's: 1e-6)",
                             range=POSITIVE, group="architecture")  # fmt: skip
    drop_rate: float = option(0.0, "dropout before the head", range=FRACTION,
                              group="regularisation")  # fmt: skip
    pos_drop_rate: float = option(0.0, "dropout after the position embedding", range=FRACTION,
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
        if self.num_classes and self.global_pool == "none":
            raise ValueError(
                "a classifier needs a pooled vector: pass global_pool='avg' (or 'max', 'avgmax') "
                "with num_classes > 0, or num_classes=0"
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

    @property
    def num_features(self) -> int:
        """The channels of the neck's map: what the head pools."""
        return self.neck_chans or self.embed_dim

    def block_window(self, index: int) -> int:
        """Block `index`'s window side; 0 where it attends globally."""
        return 0 if index in self.global_attn_indexes else self.window_size
