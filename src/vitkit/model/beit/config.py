"""`BeitConfig`: every choice that defines a model of timm's `beit.py`, declared once with
`option()` as `ViTConfig` is. The names and defaults are timm's `Beit` arguments, so timm's
weights load key for key.

BEiT is Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022); BEiT v2 Peng
et al., "BEiT v2: Masked Image Modeling with Vector-Quantized Visual Tokenizers" (2022); the
same model holds Data2Vec's vision encoder (Baevski et al., ICML 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Options, Range, option
from ..layers.patch_embed import patch_grid, to_2tuple

BEIT_POOLS = ("avg", "token", "none")
_SIDE = Range(1, 65536)


@dataclass(frozen=True, kw_only=True)
class BeitConfig(Options):
    """The architecture of a `Beit`; defaults are timm's (a ViT-B/16 with q / v biases, absolute
    positions, average pooling and fc_norm)."""

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
    qkv_bias: bool = option(True, "biases of the queries and values (keys never have one)",
                            group="architecture")  # fmt: skip
    swiglu_mlp: bool = option(False, "SwiGLU MLP (Shazeer 2020) instead of Linear-GELU-Linear",
                              group="architecture")  # fmt: skip
    scale_mlp: bool = option(False, "a norm on the MLP hidden layer", group="architecture")
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
    norm_eps: float = option(1e-6, "epsilon of every LayerNorm", range=POSITIVE,
                             group="architecture")  # fmt: skip
    init_values: float | None = option(
        None, "LayerScale init (gamma_1, gamma_2); None or 0: no LayerScale",
        range=Range(0), group="architecture",
    )  # fmt: skip
    use_abs_pos_emb: bool = option(True, "a learned absolute position embedding",
                                   group="architecture")  # fmt: skip
    use_rel_pos_bias: bool = option(
        False, "a relative position bias table in every block", group="architecture"
    )
    use_shared_rel_pos_bias: bool = option(
        False, "one relative position bias table shared by every block (rel_pos_bias)",
        group="architecture",
    )  # fmt: skip
    head_init_scale: float = option(0.001, "the head's initial weights and biases scaled by this",
                                    range=Range(0), group="architecture")  # fmt: skip
    use_fc_norm: bool | None = option(
        None, "a norm after pooling instead of after the blocks (default: on for 'avg')",
        group="architecture",
    )  # fmt: skip
    global_pool: str = option(
        "avg", "'avg' over the patch tokens, 'token' (class token) or 'none'",
        choices=BEIT_POOLS, group="architecture",
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

    @property
    def num_prefix_tokens(self) -> int:
        return 1  # the class token

    @property
    def layer_scale(self) -> bool:
        """Whether the blocks have LayerScale (timm: a non-zero `init_values`)."""
        return bool(self.init_values)

    @property
    def fc_norm(self) -> bool:
        """Whether a norm follows pooling (timm: explicit, else on for 'avg'); the norm after
        the blocks is there exactly when this is not."""
        return self.global_pool == "avg" if self.use_fc_norm is None else self.use_fc_norm
