"""`BeitConfig`: every choice that defines a model of timm's `beit.py`, declared once with
`option()` as `ViTConfig` is. The names and defaults are timm's `Beit` arguments, so timm's
weights load key for key.

BEiT is Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022); BEiT v2 Peng
et al., "BEiT v2: Masked Image Modeling with Vector-Quantized Visual Tokenizers" (2022); the
same model holds Data2Vec's vision encoder (Baevski et al., ICML 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Range, option
from ..plain_config import PlainViTConfig

BEIT_POOLS = ("avg", "token", "none")


@dataclass(frozen=True, kw_only=True)
class BeitConfig(PlainViTConfig):
    """The architecture of a `Beit`; defaults are timm's (a ViT-B/16 with q / v biases, absolute
    positions, average pooling and fc_norm)."""

    qkv_bias: bool = option(True, "biases of the queries and values (keys never have one)",
                            group="architecture")  # fmt: skip
    swiglu_mlp: bool = option(False, "SwiGLU MLP (Shazeer 2020) instead of Linear-GELU-Linear",
                              group="architecture")  # fmt: skip
    scale_mlp: bool = option(False, "a norm on the MLP hidden layer", group="architecture")
    pos_drop_rate: float = option(0.0, "dropout after the position embedding", range=FRACTION,
                                  group="regularisation")  # fmt: skip
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
