"""`RelPosConfig`: every choice that defines a model of timm's `vision_transformer_relpos.py`,
declared once with `option()` as `ViTConfig` is. The names and defaults are timm's
`VisionTransformerRelPos` arguments, so timm's weights load key for key.

The relative position bias is Swin V2's log-coordinate MLP (Liu et al., CVPR 2022); the models
are timm's ViTs without absolute positions (Wightman, pytorch-image-models, 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Options, Range, option
from ..layers.patch_embed import patch_grid, to_2tuple

RELPOS_POOLS = ("avg", "token", "none")
REL_POS_TYPES = ("mlp", "mlp_swin")
_SIDE = Range(1, 65536)


@dataclass(frozen=True, kw_only=True)
class RelPosConfig(Options):
    """The architecture of a `RelPosViT`; defaults are timm's (a ViT-B/16 with a
    log-coordinate relative position MLP in every block, LayerScale 1e-6, average pooling)."""

    NOUN = "model option"
    GROUPS = {
        "shape": "model shape (default: the preset's)",
        "regularisation": "model regularisation (default: the preset's)",
        "architecture": "model architecture (default: the preset's)",
    }

    img_size: int | tuple[int, int] = option(
        224, "input size: N or H W", range=_SIDE, metavar="N", group="shape"
    )
    patch_size: int = option(16, "patch size", range=_SIDE, group="shape")
    in_chans: int = option(3, "input channels", range=Range(1, 4096), group="shape")
    num_classes: int = option(
        1000, "head outputs; 0: pooled features only", range=Range(0, 10_000_000), group="shape"
    )
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
    rel_pos_dim: int = option(128, "hidden width of the relative position MLP", range=_SIDE,
                              group="architecture")  # fmt: skip
    shared_rel_pos: bool = option(False, "one relative position MLP for every block (timm's "
                                  "srelpos)", group="architecture")  # fmt: skip
    res_post_norm: bool = option(
        False, "post-norm blocks, x + norm(f(x)) (timm's ResPostRelPosBlock, the _rpn names)",
        group="architecture",
    )  # fmt: skip
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
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        self.grid_size  # noqa: B018 (checks img_size against patch_size)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at `img_size`."""
        size = to_2tuple(self.img_size, "img_size")
        return patch_grid(*size, (self.patch_size, self.patch_size), 0, "img_size")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token)
