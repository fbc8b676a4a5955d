"""`EvaConfig`: every choice that defines a model of timm's `eva.py`, declared once with
`option()` as `ViTConfig` is. The names and defaults are timm's `Eva` arguments, so timm's
weights load key for key.

EVA is Fang et al., "EVA: Exploring the Limits of Masked Visual Representation Learning at
Scale" (CVPR 2023); EVA-02 is Fang et al., "EVA-02: A Visual Representation for Neon Genesis"
(2024): rotary positions, SwiGLU and a norm inside the MLP. The same model holds RoPE-ViT (Heo
et al., ECCV 2024), Perception Encoder (Bolya et al., 2025) and DINOv3 (Simeoni et al., 2025).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Range, option
from ..layers.norm import NORM_LAYERS
from ..layers.rope import GRID_INDEXINGS, ROPE_KINDS
from ..plain_config import SIDE, PlainViTConfig

EVA_POOLS = ("avg", "avgmax", "max", "token", "map", "none")
ATTN_TYPES = ("eva", "rope")


@dataclass(frozen=True, kw_only=True)
class EvaConfig(PlainViTConfig):
    """The architecture of an `Eva`; defaults are timm's (a ViT-B/16 with absolute positions,
    average pooling and fc_norm: EVA's fine-tuning head)."""

    num_kv_heads: tuple[int, ...] = option(
        (),
        "grouped-query attention (attn_type='rope', qkv_fused off): key / value heads of each "
        "block, one per block; none: num_heads everywhere",
        range=SIDE,
        metavar="N",
        group="shape",
    )
    qkv_bias: bool = option(
        True,
        "biases of the queries and values (attn_type='eva': keys never have one) or of all "
        "three (attn_type='rope')",
        group="architecture",
    )
    qkv_fused: bool = option(True, "one qkv projection; off: q_proj, k_proj, v_proj",
                             group="architecture")  # fmt: skip
    qk_norm: bool = option(False, "normalise queries and keys per head", group="architecture")
    attn_type: str = option(
        "eva",
        "'eva' (EVA's attention: fused weight with q_bias / v_bias, keys unbiased) or 'rope' "
        "(timm's AttentionRope: plain biases)",
        choices=ATTN_TYPES,
        group="architecture",
    )
    swiglu_mlp: bool = option(False, "SwiGLU MLP (Shazeer 2020) instead of Linear-GELU-Linear",
                              group="architecture")  # fmt: skip
    swiglu_align_to: int = option(
        0, "round the SwiGLU hidden width up to a multiple of this (0: not)",
        range=Range(0, 65536), group="architecture",
    )  # fmt: skip
    scale_mlp: bool = option(False, "a norm on the MLP hidden layer (EVA-02 B/L)",
                             group="architecture")  # fmt: skip
    scale_attn_inner: bool = option(
        False, "a norm on the attention output before its projection (EVA-02 CLIP)",
        group="architecture",
    )  # fmt: skip
    pos_drop_rate: float = option(0.0, "dropout after the position embedding", range=FRACTION,
                                  group="regularisation")  # fmt: skip
    norm_layer: str = option("layernorm", "'layernorm' or 'rmsnorm' for every norm",
                             choices=NORM_LAYERS, group="architecture")  # fmt: skip
    norm_eps: float = option(1e-6, "epsilon of every norm", range=POSITIVE, group="architecture")
    init_values: float | None = option(
        None, "LayerScale init (gamma_1, gamma_2); None: no LayerScale",
        range=Range(0), group="architecture",
    )  # fmt: skip
    attn_only_layer_scale: bool = option(False, "LayerScale on the attention branch only",
                                         group="architecture")  # fmt: skip
    class_token: bool = option(True, "prepend a learnable class token", group="architecture")
    num_reg_tokens: int = option(0, "register tokens after the class token (Darcet et al. 2024)",
                                 range=Range(0, 4096), group="architecture")  # fmt: skip
    no_embed_class: bool = option(
        False, "the absolute position embedding covers the patches only", group="architecture"
    )
    use_abs_pos_emb: bool = option(True, "a learned absolute position embedding",
                                   group="architecture")  # fmt: skip
    use_rot_pos_emb: bool = option(False, "rotary position embeddings on queries and keys",
                                   group="architecture")  # fmt: skip
    rope_type: str = option(
        "cat",
        "'cat' (EVA-02's axial RoPE on patch indices), 'mixed' (RoPE-Mixed: learnable "
        "frequencies per block and head) or 'dinov3' (patch centres in [-1, 1])",
        choices=ROPE_KINDS,
        group="architecture",
    )
    rope_grid_offset: float = option(0.0, "added to the RoPE patch coordinates",
                                     group="architecture")  # fmt: skip
    rope_grid_indexing: str = option("ij", "RoPE coordinate order: 'ij' (row, column) or 'xy'",
                                     choices=GRID_INDEXINGS, group="architecture")  # fmt: skip
    rope_temperature: float = option(10000.0, "RoPE frequency base", range=POSITIVE,
                                     group="architecture")  # fmt: skip
    rope_rotate_half: bool = option(
        False, "rotate channel i with i + head_dim / 2 (off: channel pairs 2i, 2i + 1)",
        group="architecture",
    )  # fmt: skip
    rope_shift_coords: float | None = option(
        None, "rope_type='dinov3', training: shift the coordinates by U(-s, s) per axis",
        range=Range(0), group="regularisation",
    )  # fmt: skip
    rope_jitter_coords: float | None = option(
        None, "rope_type='dinov3', training: scale each axis by a log-uniform factor in [1/J, J]",
        range=Range(1), group="regularisation",
    )  # fmt: skip
    rope_rescale_coords: float | None = option(
        None, "rope_type='dinov3', training: scale both axes by a log-uniform factor in [1/R, R]",
        range=Range(1), group="regularisation",
    )  # fmt: skip
    ref_feat_shape: tuple[int, ...] | None = option(
        None,
        "rope_type='cat': the pre-training patch grid (H W, or one side); positions are "
        "rescaled to span it at any other grid (EVA-02)",
        range=SIDE,
        metavar="N",
        group="architecture",
    )
    use_post_norm: bool = option(
        False, "post-norm blocks, x + norm(f(x)) (EVA-02-E), without LayerScale",
        group="architecture",
    )  # fmt: skip
    use_pre_transformer_norm: bool = option(
        False, "a norm before the blocks (norm_pre); the patch projection then has no bias",
        group="architecture",
    )  # fmt: skip
    use_post_transformer_norm: bool | None = option(
        None, "the norm after the blocks (default: on unless fc_norm)", group="architecture"
    )
    use_fc_norm: bool | None = option(
        None, "a norm after pooling (default: on for 'avg')", group="architecture"
    )
    global_pool: str = option(
        "avg",
        "'avg' / 'max' / 'avgmax' over the patch tokens, 'token' (class token), 'map' "
        "(attention pooling over every token) or 'none'",
        choices=EVA_POOLS,
        group="architecture",
    )
    attn_pool_num_heads: int | None = option(None, "attention-pool heads (default: num_heads)",
                                             range=SIDE, group="architecture")  # fmt: skip
    attn_pool_mlp_ratio: float | None = option(
        None, "attention-pool MLP ratio (default: mlp_ratio)", range=POSITIVE,
        group="architecture",
    )  # fmt: skip
    dynamic_img_size: bool = option(
        False, "accept other input sizes (multiples of the patch size)", group="architecture"
    )
    dynamic_img_pad: bool = option(
        False, "with dynamic_img_size, pad inputs to whole patches", group="architecture"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.use_rot_pos_emb and self.head_dim % 4:
            raise ValueError(
                "rotary embeddings need head_dim (embed_dim / num_heads = "
                f"{self.head_dim}) to be a multiple of 4"
            )
        if self.num_kv_heads:
            if len(self.num_kv_heads) != self.depth:
                raise ValueError(
                    f"num_kv_heads has {len(self.num_kv_heads)} entries for {self.depth} blocks; "
                    "give one per block (or none)"
                )
            if self.attn_type != "rope" or self.qkv_fused or self.use_post_norm:
                raise ValueError(
                    "num_kv_heads (grouped-query attention) needs attn_type='rope', "
                    "qkv_fused=False and pre-norm blocks"
                )
            bad = [h for h in self.num_kv_heads if self.num_heads % h]
            if bad:
                raise ValueError(f"num_kv_heads {bad} do not divide num_heads {self.num_heads}")
        if self.use_post_norm and (self.qk_norm or self.attn_only_layer_scale):
            raise ValueError("qk_norm and attn_only_layer_scale need pre-norm blocks")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        augment = (self.rope_shift_coords, self.rope_jitter_coords, self.rope_rescale_coords)
        if any(a is not None for a in augment) and self.rope_type != "dinov3":
            raise ValueError("rope_*_coords augmentations are for rope_type='dinov3'")
        if self.rope_type == "mixed" and self.rope_rotate_half:
            raise ValueError(
                "rope_type='mixed' uses the interleaved layout: rope_rotate_half=False"
            )
        if self.dynamic_img_pad and not self.dynamic_img_size:
            raise ValueError("dynamic_img_pad=True needs dynamic_img_size=True")
        if self.ref_feat_shape is not None and len(self.ref_feat_shape) not in (1, 2):
            raise ValueError(f"ref_feat_shape is one side or H W, got {self.ref_feat_shape!r}")

    @property
    def ref_grid(self) -> tuple[int, int] | None:
        """`ref_feat_shape` as (rows, columns)."""
        if self.ref_feat_shape is None:
            return None
        shape = tuple(self.ref_feat_shape)
        return (shape[0], shape[0]) if len(shape) == 1 else (shape[0], shape[1])

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.num_reg_tokens

    @property
    def fc_norm(self) -> bool:
        """Whether a norm follows pooling (timm: explicit, else on for 'avg')."""
        if self.use_fc_norm is not None:
            return self.use_fc_norm
        return self.global_pool == "avg"

    @property
    def final_norm(self) -> bool:
        """Whether a norm follows the blocks (timm: explicit, else unless fc_norm)."""
        if self.use_post_transformer_norm is not None:
            return self.use_post_transformer_norm
        return not self.fc_norm

    def kv_heads(self, block: int) -> int:
        return self.num_kv_heads[block] if self.num_kv_heads else self.num_heads
