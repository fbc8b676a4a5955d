"""`RelPosConfig`: every choice that defines a model of timm's `vision_transformer_relpos.py`,
declared once with `option()` as `ViTConfig` is. The names and defaults are timm's
`VisionTransformerRelPos` arguments, so timm's weights load key for key.

The relative position bias is Swin V2's log-coordinate MLP (Liu et al., CVPR 2022); the models
are timm's ViTs without absolute positions (Wightman, pytorch-image-models, 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import Range, option
from ..plain_config import SIDE, PlainViTConfig

RELPOS_POOLS = ("avg", "token", "none")
REL_POS_TYPES = ("mlp", "mlp_swin")


@dataclass(frozen=True, kw_only=True)
class RelPosConfig(PlainViTConfig):
    """The architecture of a `RelPosViT`; defaults are timm's (a ViT-B/16 with a
    log-coordinate relative position MLP in every block, LayerScale 1e-6, average pooling)."""

    qkv_bias: bool = option(True, "biases of the query, key and value projections",
                            group="architecture")  # fmt: skip
    qk_norm: bool = option(False, "normalise queries and keys per head", group="architecture")
    init_values: float | None = option(
        1e-6, "LayerScale init (pre-norm blocks), or the post-norms' init (res_post_norm); "
        "None: no LayerScale", range=Range(0), group="architecture",
    )  # fmt: skip
    class_token: bool = option(False, "prepend a learnable class token", group="architecture")
    fc_norm: bool = option(False, "a norm after pooling instead of after the blocks",
                           group="architecture")  # fmt: skip
    global_pool: str = option("avg", "'avg' over the patch tokens, 'token' (class token) or "
                              "'none'", choices=RELPOS_POOLS, group="architecture")  # fmt: skip
    rel_pos_type: str = option(
        "mlp", "'mlp' (timm's log-coordinate MLP) or 'mlp_swin' (Swin V2's: log2, 16 * sigmoid)",
        choices=REL_POS_TYPES, group="architecture",
    )  # fmt: skip
    rel_pos_dim: int = option(128, "hidden width of the relative position MLP", range=SIDE,
                              group="architecture")  # fmt: skip
    shared_rel_pos: bool = option(False, "one relative position MLP for every block (timm's "
                                  "srelpos)", group="architecture")  # fmt: skip
    res_post_norm: bool = option(
        False, "post-norm blocks, x + norm(f(x)) (timm's ResPostRelPosBlock, the _rpn names)",
        group="architecture",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token)
