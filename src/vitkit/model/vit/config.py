"""`ViTConfig`: every choice that defines a Vision Transformer, declared once (`options.py`:
type, default, help, range or choices per field), checked once, saved as JSON.

The patch grid itself (`patch_grid`) is the patch embedding's (layers/patch_embed.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Options, Range, default_of, option, option_names
from ..layers.mlp import ACT_LAYERS, MLP_LAYERS
from ..layers.norm import NORM_LAYERS
from ..layers.patch_embed import PATCH_EMBED_KINDS, patch_grid, stem_output_size, to_2tuple
from ..layers.pos_embed import POS_EMBED_KINDS

# 'map' is attention pooling (SigLIP's multihead attention pooling head); 'none' keeps every
# token (timm's global_pool='').
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map", "none")
ENCODERS = ("native", "torch")
HYBRIDS = ("none", "resnetv2", "mbconv")
BLOCKS = ("plain", "parallel_scaling", "parallel_things")
ATTN_LAYERS = ("attn", "diff")
TOKEN_INITS = ("trunc_normal", "zeros")


# -- geometry --------------------------------------------------------------------------------------


def hybrid_strides(hybrid: str, layers: tuple[int, ...]) -> int:
    """Stride-2 steps of a hybrid backbone: the ResNet stem's two, one per stage after the
    first (layers/resnetv2.py); ViTamin's stem, one per stage and its last convolution
    (layers/mbconv.py)."""
    if hybrid == "mbconv":
        return len(layers) + 2
    return 0 if hybrid == "none" else 2 + max(len(layers) - 1, 0)


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
        "same with both in one fc1 (gate first) of width embed_dim * mlp_ratio, half of it gate; "
        "'geglu' (ViTamin's: a LayerNorm, then act(x W_0) * (x W_1) and a Linear; layers w0, "
        "w1, w2)",
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
        "vit_*_r26_*) runs on the image and the patches are cut from its feature map; "
        "'mbconv' (ViTamin's stem: MbConv blocks with LayerNorm2d, then a strided 3x3 "
        "convolution to embed_dim, which replaces the patch projection; patch_size 1)",
        choices=HYBRIDS,
        group="architecture",
        family=True,
    )
    hybrid_layers: tuple[int, ...] = option(
        (),
        "with hybrid='resnetv2', bottleneck blocks per stage (R50: 3 4 9, R26: 2 2 2 2); none: "
        "the ResNet stem alone; with hybrid='mbconv', MbConv blocks per stage (ViTamin: 2 4)",
        range=Range(1, 64),
        metavar="BLOCKS",
        group="architecture",
        family=True,
    )
    hybrid_widths: tuple[int, ...] = option(
        (),
        "with hybrid='mbconv', the channels of each stage, the stem as wide as the first "
        "(ViTamin-S: 64 128, -B: 128 256, -L: 160 320, -XL: 192 384)",
        range=Range(1, 65536),
        metavar="CHANNELS",
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
        check_config(self)  # the rules below

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
    def first_conv(self) -> str:
        """The module that takes the image (timm's `pretrained_cfg['first_conv']`): the patch
        projection, or the first convolution of the stem (vitkit's conv stem, timm's ResNetV2
        or its stem alone, ViTamin's stem)."""
        if self.conv_stem:
            return "patch_embed.backbone.0"
        if self.hybrid == "mbconv":
            return "patch_embed.backbone.stem.conv1"
        if self.hybrid == "resnetv2":
            return (
                "patch_embed.backbone.stem.conv"
                if self.hybrid_layers
                else "patch_embed.backbone.conv"
            )
        return "patch_embed.proj"

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


# -- the consistency rules, checked once when a config is made ---------------------------------

# Upper bound of the MLP width, far above any published ViT (ViT-22B: 24576).
MAX_MLP_WIDTH = 1 << 20

# Block options that nn.TransformerEncoderLayer cannot express (encoder='torch').
_NATIVE_ONLY = ("qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "act_layer",
                "norm_layer", "mlp_layer", "res_post_norm", "block", "attn_layer")  # fmt: skip


def check_config(config: ViTConfig) -> None:
    """Raise a ValueError with the fix for the first rule `config` breaks."""
    check_widths(config)
    check_tokens(config)
    check_encoder(config)
    check_windows(config)
    check_blocks(config)


def check_widths(config: ViTConfig) -> None:
    width = config.embed_dim * config.mlp_ratio
    if int(width) < 1:
        raise ValueError(
            f"mlp_ratio {config.mlp_ratio} gives an MLP of width 0 for embed_dim "
            f"{config.embed_dim}; choose mlp_ratio >= {1 / config.embed_dim:.3g}"
        )
    if width > MAX_MLP_WIDTH:
        raise ValueError(
            f"mlp_ratio {config.mlp_ratio} gives an MLP of width {width:,.0f} for embed_dim "
            f"{config.embed_dim}; the most is {MAX_MLP_WIDTH:,}"
        )
    if config.mlp_layer == "geglu" and config.scale_mlp_norm:
        raise ValueError(
            "mlp_layer='geglu' norms its input, not its hidden layer; pass scale_mlp_norm=False"
        )
    if config.mlp_layer == "swiglu_packed" and int(width) % 2:
        raise ValueError(
            f"mlp_layer='swiglu_packed' splits fc1 in halves, but embed_dim "
            f"{config.embed_dim} * mlp_ratio {config.mlp_ratio} is odd; choose an even width"
        )
    if config.embed_dim % config.num_heads:
        raise ValueError(
            f"embed_dim {config.embed_dim} is not divisible by num_heads {config.num_heads}; "
            f"choose num_heads among the divisors of {config.embed_dim}"
        )


def check_tokens(config: ViTConfig) -> None:
    if config.pool_include_prefix and config.global_pool == "token":
        raise ValueError("pool_include_prefix=True needs a global_pool other than 'token'")
    if config.global_pool == "token" and not config.class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")
    if config.distilled and config.global_pool != "token":
        raise ValueError("distilled=True needs global_pool='token' and class_token=True")
    if config.distilled and config.reg_tokens:
        raise ValueError("distilled=True takes no reg_tokens; use one or the other")


def check_encoder(config: ViTConfig) -> None:
    if config.encoder != "torch":
        return
    changed = [
        f"{name}={getattr(config, name)!r}"
        for name in _NATIVE_ONLY
        if getattr(config, name) != default_of(type(config), name)
    ]
    if changed:
        raise ValueError(
            f"encoder='torch' (nn.TransformerEncoderLayer) cannot express "
            f"{', '.join(changed)}; use encoder='native'"
        )


def check_windows(config: ViTConfig) -> None:
    spatial = config.window_size > 0 or config.use_rel_pos
    if config.global_blocks and not config.window_size:
        raise ValueError("global_blocks needs window_size > 0; pass --window-size too")
    wrong = [i for i in config.global_blocks if i >= config.depth]
    if wrong:
        raise ValueError(
            f"global_blocks {wrong} out of range for depth {config.depth}; use 0 to "
            f"{config.depth - 1}"
        )
    if not spatial:
        if config.rel_pos_img_size is not None:
            raise ValueError("rel_pos_img_size needs use_rel_pos=True")
        return
    what = "window attention" if config.window_size else "relative positions"
    if config.num_prefix_tokens:
        raise ValueError(
            f"{what} works on the patch grid, which prefix tokens are not on (ViTDet has no "
            "class token); pass class_token=False, global_pool='avg', reg_tokens=0"
        )
    if config.encoder != "native" or config.res_post_norm:
        raise ValueError(f"{what} needs encoder='native' and res_post_norm=False")


def check_mbconv(config: ViTConfig) -> None:
    if config.hybrid_widths and config.hybrid != "mbconv":
        raise ValueError("hybrid_widths needs hybrid='mbconv'")
    if config.hybrid != "mbconv":
        return
    if not config.hybrid_layers or len(config.hybrid_widths) != len(config.hybrid_layers):
        raise ValueError(
            f"hybrid='mbconv' needs blocks and channels per stage, got hybrid_layers="
            f"{config.hybrid_layers}, hybrid_widths={config.hybrid_widths}; pass one width "
            "per stage (ViTamin-S: hybrid_layers=(2, 4), hybrid_widths=(64, 128))"
        )
    if to_2tuple(config.patch_size, "patch_size") != (1, 1) or config.patch_embed != "conv":
        raise ValueError(
            "hybrid='mbconv' ends in its own convolution to embed_dim, with no patch "
            "projection after it; pass patch_size=1, patch_embed='conv'"
        )


def check_blocks(config: ViTConfig) -> None:
    if config.conv_stem_strides and len(config.conv_stem_strides) != len(config.conv_stem):
        raise ValueError(
            f"conv_stem_strides has {len(config.conv_stem_strides)} strides for "
            f"{len(config.conv_stem)} conv_stem layers; give one per layer"
        )
    if config.hybrid_layers and config.hybrid == "none":
        raise ValueError("hybrid_layers needs hybrid='resnetv2' or 'mbconv'")
    check_mbconv(config)
    if config.hybrid != "none" and config.conv_stem:
        raise ValueError("hybrid and conv_stem are two stems; pass one of them")
    if config.hybrid != "none" and config.dynamic_img_pad:
        raise ValueError("dynamic_img_pad=True pads raw images; it cannot follow a hybrid stem")
    if config.block == "parallel_things" and config.attn_layer != "attn":
        raise ValueError("block='parallel_things' has plain attention only (as timm)")
    scaling_lacks = (
        config.scale_attn_norm,
        config.scale_mlp_norm,
        config.mlp_layer != "mlp",
        config.qk_scale is not None,
    )
    if config.block == "parallel_scaling" and any(scaling_lacks):
        raise ValueError(
            "block='parallel_scaling' fuses a plain MLP into its input projection: it takes no "
            "scale_attn_norm, scale_mlp_norm, qk_scale or mlp_layer other than 'mlp' (as timm)"
        )
    custom = config.block != "plain" or config.attn_layer != "attn"
    if custom and (config.res_post_norm or config.window_size or config.use_rel_pos):
        raise ValueError(
            f"block={config.block!r}, attn_layer={config.attn_layer!r} are pre-norm blocks with "
            "global attention; pass res_post_norm=False, window_size=0, use_rel_pos=False"
        )
