"""`SamConfig`: every choice that defines a model of timm's `vision_transformer_sam.py`, declared
once with `option()` as `ViTConfig` is. The names and defaults are timm's `VisionTransformerSAM`
arguments (its Segment Anything presets': the class's own `num_classes=768` is no preset's), so
timm's weights load key for key.

SAM is Kirillov et al., "Segment Anything" (ICCV 2023); its image encoder is ViTDet's backbone
(Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", ECCV 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Range, option
from ..plain_config import SIDE, PlainViTConfig

SAM_POOLS = ("avg", "max", "avgmax", "none")


@dataclass(frozen=True, kw_only=True)
class SamConfig(PlainViTConfig):
    """The architecture of a `SamViT`; defaults are timm's SAM ViT-B/16 image encoder (1024 x
    1024 input, 14 x 14 windows, decomposed relative positions, a 256-channel neck, no
    classifier)."""

    img_size: int | tuple[int, int] = option(
        1024, "input size: N or H W (other multiples of the patch size run too)",
        range=SIDE, metavar="N", group="shape",
    )  # fmt: skip
    num_classes: int = option(
        0, "head outputs; 0: the pooled neck features only", range=Range(0, 10_000_000),
        group="shape",
    )  # fmt: skip
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
    pos_drop_rate: float = option(0.0, "dropout after the position embedding", range=FRACTION,
                                  group="regularisation")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes and self.global_pool == "none":
            raise ValueError(
                "a classifier needs a pooled vector: pass global_pool='avg' (or 'max', 'avgmax') "
                "with num_classes > 0, or num_classes=0"
            )

    @property
    def num_features(self) -> int:
        """The channels of the neck's map: what the head pools."""
        return self.neck_chans or self.embed_dim

    def block_window(self, index: int) -> int:
        """Block `index`'s window side; 0 where it attends globally."""
        return 0 if index in self.global_attn_indexes else self.window_size
