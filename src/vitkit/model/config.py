"""`ViTConfig`: every choice that defines a Vision Transformer, declared once (`options.py`:
type, default, help, range or choices per field), checked once, saved as JSON.

It also owns the geometry: `patch_grid` is the one computation of the patch grid, used by the
model, the weight converters and the position-embedding resampler.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import (
    FRACTION,
    POSITIVE,
    Options,
    Range,
    default_of,
    option,
    option_names,
)
from .config_checks import check_config
from .pos_embed import POS_EMBED_KINDS

PATCH_EMBED_KINDS = ("conv", "unfold")
# 'map' is attention pooling (SigLIP's multihead attention pooling head); 'none' keeps every
# token (timm's global_pool='').
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map", "none")
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
NORM_LAYERS = ("layernorm", "rmsnorm")
MLP_LAYERS = ("mlp", "swiglu", "swiglu_packed")
ENCODERS = ("native", "torch")
HYBRIDS = ("none", "resnetv2")
BLOCKS = ("plain", "parallel_scaling", "parallel_things")
ATTN_LAYERS = ("attn", "diff")
TOKEN_INITS = ("trunc_normal", "zeros")


# -- geometry --------------------------------------------------------------------------------------


def to_2tuple(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as an (h, w) tuple of positive ints."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{name} must be a positive int or an (h, w) pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def hybrid_strides(hybrid: str, layers: tuple[int, ...]) -> int:
    """Stride-2 steps of a hybrid backbone: the ResNet stem's two, one per stage after the
    first (layers/resnetv2.py)."""
    return 0 if hybrid == "none" else 2 + max(len(layers) - 1, 0)


def stem_output_size(size: int, layers: int) -> int:
    """A side of the feature map after `layers` 3x3 stride-2 convolutions padded by 1."""
    for _ in range(layers):
        size = (size + 1) // 2
    return size


def patch_grid(
    height: int,
    width: int,
    patch_size: tuple[int, int],
    stem_layers: int = 0,
    what: str = "input",
    floor: bool = False,
) -> tuple[int, int]:
    """The patch grid (rows, columns) of a height x width image cut into `patch_size` patches,
    after `stem_layers` stride-2 stem convolutions; a ValueError with the fix when the image
    (or the stem's feature map) does not split into whole patches, unless `floor` (the last
    partial patch dropped)."""
    grid = []
    for side, size, patch in zip(("height", "width"), (height, width), patch_size):
        feature = stem_output_size(size, stem_layers)
        if feature % patch and not floor:
            if stem_layers:
                raise ValueError(
                    f"{what} {side} {size} gives a {feature}-pixel conv-stem feature map, "
                    f"not divisible by patch_size {side} {patch}; choose a size whose "
                    f"feature map is a multiple of {patch}"
                )
            if what == "input":
                raise ValueError(
                    f"input {side} {size} is not divisible by patch size {patch}; "
                    f"resize to a multiple of {patch}"
                )
            raise ValueError(
                f"{what} {side} {size} is not divisible by patch_size {side} {patch}; "
                f"use an {what} that is a multiple of {patch}"
            )
        grid.append(feature // patch)
    return grid[0], grid[1]


# Upper bounds of the sizes (the ranges of the fields below), far above any published ViT
# (ViT-22B: width 6144, depth 48), so that a typo or a doctored file is refused at once instead
# of allocating for hours; products of sizes have their own bounds.
_SIDE = Range(1, 65536)
MAX_PATCHES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ViTConfig(Options):
    """The architecture of a `VisionTransformer`; defaults are ViT-B/16 at 224 (paper Table 1).

    Each field's help says what it does; `family=True` marks the options later families added
    (their default is the paper's choice), which `family_options` lists.
    """

    NOUN = "model option"
    GROUPS = {
        "shape": "model shape (default: the preset's)",
        "regularisation": "model regularisation (default: the preset's)",
        "architecture": "model architecture (default: the preset's)",
    }

    img_size: int | tuple[int, int] = option(
        224, "input size: N or H W", range=_SIDE, metavar="N", group="shape"
    )
    patch_size: int | tuple[int, int] = option(
        16, "patch size: N or H W", range=_SIDE, metavar="N", group="shape"
    )
    in_chans: int = option(3, "input channels", range=Range(1, 4096), group="shape")
    conv_stem: tuple[int, ...] = option(
        (),
        "the paper's hybrid (Section 3.1): output channels of 3x3 convolutions (stride 2 unless "
        "conv_stem_strides; each with BatchNorm and ReLU) run on the image before the patch "
        "projection, which then cuts patches of their feature map (1: every feature-map pixel "
        "is a token); none: patches of the raw image",
        range=Range(1, 65536, note="(channels per layer)"),
        metavar="CHANNELS",
        group="shape",
    )
    conv_stem_strides: tuple[int, ...] = option(
        (),
        "stride of each conv_stem layer, 1 or 2 (Xiao et al.'s larger stems have stride-1 "
        "layers: 2 2 1 2 1 2); none: 2 for every layer",
        range=Range(1, 2),
        metavar="STRIDE",
        group="shape",
    )
    num_classes: int = option(
        1000, "head outputs; 0: pooled features only, 1: a regression head",
        range=Range(0, 10_000_000), group="shape",
    )  # fmt: skip
    embed_dim: int = option(768, "token width D", range=_SIDE, group="shape")
    depth: int = option(12, "number of encoder blocks", range=Range(1, 1024), group="shape")
    num_heads: int = option(12, "attention heads; must divide embed_dim", range=_SIDE,
                            group="shape")  # fmt: skip
    mlp_ratio: float = option(4.0, "MLP hidden width as a multiple of embed_dim",
                              range=POSITIVE, group="shape")  # fmt: skip

    qkv_bias: bool = option(True, "bias in the fused qkv projection", group="architecture")
    qk_scale: float | None = option(None, "attention scale (default: head_dim ** -0.5)",
                                    range=POSITIVE, group="architecture")  # fmt: skip
    drop_rate: float = option(
        0.0,
        "dropout after the position embedding, after every dense layer but qkv (paper "
        "Appendix B.1), and before the head",
        range=FRACTION,
        group="regularisation",
    )
    attn_drop_rate: float = option(0.0, "dropout on the attention weights", range=FRACTION,
                                   group="regularisation")  # fmt: skip
    drop_path_rate: float = option(
        0.0, "stochastic depth at the last block, rising linearly from 0 at the first",
        range=FRACTION, group="regularisation",
    )  # fmt: skip

    class_token: bool = option(True, "prepend a learnable class token", group="architecture")
    global_pool: str = option(
        "token",
        "'token' (class token), 'avg' / 'max' / 'avgmax' (mean, max, or their average over the "
        "patch tokens), 'map' (attention pooling with a learned query, as SigLIP) or 'none' "
        "(forward_head gets every token)",
        choices=GLOBAL_POOLS,
        group="architecture",
    )
    fc_norm: bool | None = option(
        None,
        "norm after pooling instead of before (timm's fc_norm; default: on for avg, max and "
        "avgmax)",
        group="architecture",
    )
    pos_embed: str = option(
        "learn", "'learn', 'sinusoid' (1-D, fixed), 'sincos2d' (2-D, fixed) or 'none'",
        choices=POS_EMBED_KINDS, group="architecture",
    )  # fmt: skip
    patch_embed: str = option("conv", "'conv' (strided Conv2d) or 'unfold' (nn.Unfold + Linear)",
                              choices=PATCH_EMBED_KINDS, group="architecture")  # fmt: skip
    embed_norm: bool = option(False, "LayerNorm after the patch projection",
                              group="architecture")  # fmt: skip
    encoder: str = option("native", "'native' blocks or 'torch' (nn.TransformerEncoderLayer)",
                          choices=ENCODERS, group="architecture")  # fmt: skip
    dynamic_img_size: bool = option(
        False, "accept other input sizes, resampling the position grid", group="architecture"
    )
    init_values: float | None = option(
        None,
        "LayerScale init (default: no LayerScale); with res_post_norm the blocks have no "
        "LayerScale and it is the initial scale of their norms (as timm)",
        range=Range(0, note="(0 or None: no LayerScale)"),
        group="architecture",
    )
    distilled: bool = option(False, "add DeiT's distillation token and head",
                             group="architecture")  # fmt: skip
    token_init: str = option(
        "trunc_normal",
        "'trunc_normal' (std 0.02) or 'zeros' for the class token and learned positions",
        choices=TOKEN_INITS,
        group="architecture",
    )
    norm_eps: float = option(1e-6, "epsilon of every norm", range=POSITIVE, group="architecture")
    reg_tokens: int = option(
        0,
        'register tokens after the class token (Darcet et al., "Vision Transformers Need '
        'Registers", 2024)',
        range=Range(0, 4096),
        group="architecture",
        family=True,
    )
    no_embed_class: bool = option(
        False,
        "the position embedding covers the patches only; prefix tokens get none (DeiT III, "
        "FlexiViT, DINOv2 with registers)",
        group="architecture",
        family=True,
    )
    pre_norm: bool = option(False, "a norm before the encoder (norm_pre, as CLIP)",
                            group="architecture", family=True)  # fmt: skip
    final_norm: bool = option(
        True,
        "the norm after the encoder (or after pooling, with fc_norm); off drops it (RADIO, "
        "InternViT)",
        group="architecture",
        family=True,
    )
    patch_bias: bool = option(True, "bias in the patch projection (CLIP has none)",
                              group="architecture", family=True)  # fmt: skip
    dynamic_img_pad: bool = option(
        False,
        "with dynamic_img_size, pad the input right / bottom to whole patches instead of "
        "refusing it",
        group="architecture",
    )
    pool_include_prefix: bool = option(
        False, "pool over the prefix tokens too (not for 'token')", group="architecture",
        family=True,
    )  # fmt: skip
    qk_norm: bool = option(
        False, "normalise queries and keys per head (Dehghani et al., ViT-22B, 2023)",
        group="architecture", family=True,
    )  # fmt: skip
    scale_attn_norm: bool = option(
        False, "a norm on the attention output before its projection (BEiT-3)",
        group="architecture", family=True,
    )  # fmt: skip
    scale_mlp_norm: bool = option(
        False, "a norm on the MLP hidden layer before its output (BEiT-3)",
        group="architecture", family=True,
    )  # fmt: skip
    proj_bias: bool = option(
        True, "biases in the attention output projection and the MLP layers",
        group="architecture", family=True,
    )  # fmt: skip
    act_layer: str = option(
        "gelu",
        "the MLP activation: 'gelu' (exact erf), 'gelu_tanh' (tanh approximation), "
        "'quick_gelu' (x * sigmoid(1.702 x), OpenAI CLIP) or 'silu'",
        choices=ACT_LAYERS,
        group="architecture",
        family=True,
    )
    norm_layer: str = option(
        "layernorm", "'layernorm' or 'rmsnorm' (Zhang & Sennrich, 2019) for every norm",
        choices=NORM_LAYERS, group="architecture", family=True,
    )  # fmt: skip
    mlp_layer: str = option(
        "mlp",
        "'mlp' (Linear, act, Linear), 'swiglu' (act(x W_g) * (x W_x), then a Linear; Shazeer "
        "2020) with gate and value as separate layers fc1_g / fc1_x, or 'swiglu_packed', the "
        "same with both in one fc1 (gate first) of width embed_dim * mlp_ratio, half of it gate",
        choices=MLP_LAYERS,
        group="architecture",
        family=True,
    )
    res_post_norm: bool = option(
        False,
        "norm each residual branch's output, x + norm(f(x)), instead of its input (Swin v2's "
        "res-post-norm; timm's ResPostBlock)",
        group="architecture",
        family=True,
    )

    pos_embed_antialias: bool = option(
        True,
        "antialias the learned position grid when dynamic_img_size resamples it (timm); off: "
        "plain bicubic, as ViTDet (detectron2, HF VitDet)",
        group="architecture",
    )
    window_size: int = option(
        0,
        "ViTDet's window attention (Li et al., 2022): every block but global_blocks attends "
        "within window_size x window_size patches, the grid padded to whole windows; 0: global "
        "attention everywhere",
        range=Range(0, 65536),
        group="architecture",
        family=True,
    )
    global_blocks: tuple[int, ...] = option(
        (),
        "with window_size, the indices of the blocks that keep global attention (ViTDet-B: "
        "2 5 8 11)",
        range=Range(0, 1023),
        metavar="INDEX",
        group="architecture",
        family=True,
    )
    use_rel_pos: bool = option(
        False,
        "decomposed relative positions added to the attention scores (MViTv2, ViTDet): tables "
        "rel_pos_h / rel_pos_w per block, interpolated to other window or grid sizes",
        group="architecture",
        family=True,
    )
    rel_pos_img_size: int | tuple[int, int] | None = option(
        None,
        "input size the global blocks' relative-position tables are made for (detectron2's "
        "img_size; default: img_size)",
        range=_SIDE,
        metavar="N",
        group="architecture",
        family=True,
    )

    hybrid: str = option(
        "none",
        "the paper's hybrid (Section 3.1) with timm's CNN: 'resnetv2' (BiT's ResNet: "
        "weight-standardised convolutions, GroupNorm, 'SAME' padding; timm's vit_*_r50_*, "
        "vit_*_r26_*) runs on the image and the patches are cut from its feature map",
        choices=HYBRIDS,
        group="architecture",
        family=True,
    )
    hybrid_layers: tuple[int, ...] = option(
        (),
        "with hybrid='resnetv2', bottleneck blocks per stage (R50: 3 4 9, R26: 2 2 2 2); none: "
        "the ResNet stem alone",
        range=Range(1, 64),
        metavar="BLOCKS",
        group="architecture",
        family=True,
    )
    block: str = option(
        "plain",
        "'plain' blocks, 'parallel_scaling' (attention and MLP side by side from one norm and "
        "one fused input projection, ViT-22B; timm's ParallelScalingBlock) or "
        "'parallel_things' (two attention, then two MLP branches summed, Touvron et al. 2022; "
        "timm's ParallelThingsBlock)",
        choices=BLOCKS,
        group="architecture",
        family=True,
    )
    attn_layer: str = option(
        "attn",
        "'attn' or 'diff': differential attention (Ye et al., \"Differential Transformer\", "
        "2024; timm's DiffAttention), the difference of two softmax maps",
        choices=ATTN_LAYERS,
        group="architecture",
        family=True,
    )
    floor_grid: bool = option(
        False,
        "cut floor(img_size / patch_size) patches per side, the convolution dropping the "
        "remaining pixels (timm at a fixed size: vit_so400m_patch14_siglip_384); off: refuse "
        "sizes that are not multiples",
        group="shape",
        family=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # each field's type, range and choices
        self._check_patch_count()
        check_config(self)  # config_checks.py

    def _check_patch_count(self) -> None:
        stem = self.stem_strides
        height, width = to_2tuple(self.img_size, "img_size")
        patch_h, patch_w = to_2tuple(self.patch_size, "patch_size")
        patches = (stem_output_size(height, stem) // patch_h) * (
            stem_output_size(width, stem) // patch_w
        )
        if patches > MAX_PATCHES:
            raise ValueError(
                f"img_size {self.img_size} in patches of {self.patch_size} makes {patches:,} "
                f"patches; the most is {MAX_PATCHES:,}: use larger patches or a smaller image"
            )
        if self.dynamic_img_pad and not self.dynamic_img_size:
            raise ValueError("dynamic_img_pad=True needs dynamic_img_size=True")
        if self.dynamic_img_pad and self.conv_stem:
            raise ValueError("dynamic_img_pad=True pads raw images; it cannot follow a conv_stem")

    @property
    def stem_strides(self) -> int:
        """Stride-2 steps before the patch projection (conv stem or hybrid backbone)."""
        if self.conv_stem:
            return sum(stride == 2 for stride in self.conv_stem_layer_strides)
        return hybrid_strides(self.hybrid, self.hybrid_layers)

    @property
    def conv_stem_layer_strides(self) -> tuple[int, ...]:
        """The stride of each conv_stem layer (2 unless `conv_stem_strides` says)."""
        return self.conv_stem_strides or (2,) * len(self.conv_stem)

    @property
    def rel_pos_grid(self) -> tuple[int, int]:
        """The patch grid the global blocks' relative-position tables are sized for."""
        size = self.img_size if self.rel_pos_img_size is None else self.rel_pos_img_size
        return patch_grid(
            *to_2tuple(size, "rel_pos_img_size"),
            to_2tuple(self.patch_size, "patch_size"),
            self.stem_strides,
            "rel_pos_img_size",
            self.floor_grid,
        )

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at `img_size`."""
        return patch_grid(
            *to_2tuple(self.img_size, "img_size"),
            to_2tuple(self.patch_size, "patch_size"),
            self.stem_strides,
            "img_size",
            self.floor_grid,
        )

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class token, then distillation or register tokens."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def pos_prefix_tokens(self) -> int:
        """Prefix tokens that have a position embedding: none with `no_embed_class`."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    @property
    def use_fc_norm(self) -> bool:
        """Whether the final norm follows pooling (`fc_norm`) rather than the encoder."""
        if self.fc_norm is not None:
            return self.fc_norm
        return self.global_pool in ("avg", "avgmax", "max")

    def family_options(self) -> list[str]:
        """The options beyond the paper's ViT and DeiT that this config sets, as 'name=value':
        exporters to libraries that lack them refuse these by name."""
        return [
            f"{name}={getattr(self, name)!r}"
            for name in option_names(ViTConfig, "family")
            if getattr(self, name) != default_of(ViTConfig, name)
        ]
