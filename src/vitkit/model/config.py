"""`ViTConfig`: every choice that defines a Vision Transformer, checked once, saved as JSON.

It also owns the geometry: `patch_grid` is the one computation of the patch grid, used by the
model, the weight converters and the position-embedding resampler.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

from .pos_embed import POS_EMBED_KINDS

PATCH_EMBED_KINDS = ("conv", "unfold")
# 'map' is attention pooling (SigLIP's multihead attention pooling head); 'none' keeps every
# token (timm's global_pool='').
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map", "none")
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
NORM_LAYERS = ("layernorm", "rmsnorm")
MLP_LAYERS = ("mlp", "swiglu", "swiglu_packed")
ENCODERS = ("native", "torch")
TOKEN_INITS = ("trunc_normal", "zeros")


# -- geometry --------------------------------------------------------------------------------------


def to_2tuple(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as an (h, w) tuple of positive ints."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{name} must be a positive int or an (h, w) pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def check_choice(name: str, value: object, choices: tuple) -> None:
    """Raise a ValueError naming the option and its allowed values."""
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")


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
) -> tuple[int, int]:
    """The patch grid (rows, columns) of a height x width image cut into `patch_size` patches,
    after `stem_layers` stride-2 stem convolutions; a ValueError with the fix when the image
    (or the stem's feature map) does not split into whole patches."""
    grid = []
    for side, size, patch in zip(("height", "width"), (height, width), patch_size):
        feature = stem_output_size(size, stem_layers)
        if feature % patch:
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


_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "img_size": (int, tuple, list),
    "patch_size": (int, tuple, list),
    "in_chans": (int,),
    "conv_stem": (tuple, list),
    "num_classes": (int,),
    "embed_dim": (int,),
    "depth": (int,),
    "num_heads": (int,),
    "mlp_ratio": _NUMBER,
    "qkv_bias": (bool,),
    "qk_scale": _NUMBER + (type(None),),
    "drop_rate": _NUMBER,
    "attn_drop_rate": _NUMBER,
    "drop_path_rate": _NUMBER,
    "class_token": (bool,),
    "global_pool": (str,),
    "fc_norm": (bool, type(None)),
    "pos_embed": (str,),
    "patch_embed": (str,),
    "embed_norm": (bool,),
    "encoder": (str,),
    "dynamic_img_size": (bool,),
    "init_values": _NUMBER + (type(None),),
    "distilled": (bool,),
    "token_init": (str,),
    "norm_eps": _NUMBER,
    "reg_tokens": (int,),
    "no_embed_class": (bool,),
    "pre_norm": (bool,),
    "final_norm": (bool,),
    "patch_bias": (bool,),
    "dynamic_img_pad": (bool,),
    "pool_include_prefix": (bool,),
    "qk_norm": (bool,),
    "scale_attn_norm": (bool,),
    "scale_mlp_norm": (bool,),
    "proj_bias": (bool,),
    "act_layer": (str,),
    "norm_layer": (str,),
    "mlp_layer": (str,),
    "res_post_norm": (bool,),
}

# The options later families added, with the paper's choice.
_FAMILY_DEFAULTS = {
    "reg_tokens": 0,
    "no_embed_class": False,
    "pre_norm": False,
    "final_norm": True,
    "patch_bias": True,
    "pool_include_prefix": False,
    "qk_norm": False,
    "scale_attn_norm": False,
    "scale_mlp_norm": False,
    "proj_bias": True,
    "act_layer": "gelu",
    "norm_layer": "layernorm",
    "mlp_layer": "mlp",
    "res_post_norm": False,
}

# Block options that nn.TransformerEncoderLayer cannot express (encoder='torch'), with their
# defaults: the paper's block.
_NATIVE_BLOCK_DEFAULTS = {
    name: _FAMILY_DEFAULTS[name]
    for name in ("qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "act_layer",
                 "norm_layer", "mlp_layer", "res_post_norm")
}  # fmt: skip


# Upper bounds of the sizes, far above any published ViT (ViT-22B: width 6144, depth 48), so
# that a typo or a doctored file is refused at once instead of allocating for hours.
SIZE_LIMITS = {  # name: (least, most)
    "img_size": (1, 65536),
    "patch_size": (1, 65536),
    "in_chans": (1, 4096),
    "num_classes": (0, 10_000_000),
    "embed_dim": (1, 65536),
    "depth": (1, 1024),
    "num_heads": (1, 65536),
    "reg_tokens": (0, 4096),
}
MAX_MLP_WIDTH = 1 << 20
MAX_PATCHES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """The architecture of a `VisionTransformer`; defaults are ViT-B/16 at 224 (paper Table 1).

    Args:
        img_size: input size, an int or (h, w).
        patch_size: patch size, an int or (h, w).
        in_chans: input channels.
        conv_stem: the paper's hybrid (Section 3.1): output channels of 3x3 stride-2
            convolutions, each with BatchNorm and ReLU, run on the image before the patch
            projection, which then cuts `patch_size` patches from their feature map (1: every
            feature-map pixel is a token). Empty: patches of the raw image.
        num_classes: head outputs; 0 gives pooled features only, 1 a regression head.
        embed_dim: token width D.
        depth: number of encoder blocks.
        num_heads: attention heads; must divide embed_dim.
        mlp_ratio: MLP hidden width as a multiple of embed_dim.
        qkv_bias: bias in the fused qkv projection.
        qk_scale: attention scale; None means head_dim ** -0.5.
        drop_rate: dropout after the position embedding, after every dense layer but qkv
            (paper Appendix B.1), and before the head.
        attn_drop_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth at the last block, rising linearly from 0.
        class_token: prepend a learnable class token.
        global_pool: 'token' (class token), 'avg' / 'max' / 'avgmax' (mean, max, or their
            average over the patch tokens), 'map' (attention pooling with a learned query, as
            SigLIP) or 'none' (forward_head gets every token).
        fc_norm: norm after pooling instead of before (timm's `fc_norm`); None means on for
            'avg', 'max' and 'avgmax'.
        pos_embed: 'learn', 'sinusoid' (1-D, fixed), 'sincos2d' (2-D, fixed) or 'none'.
        patch_embed: 'conv' (strided Conv2d) or 'unfold' (nn.Unfold + Linear).
        embed_norm: LayerNorm after the patch projection.
        encoder: 'native' blocks or 'torch' (nn.TransformerEncoderLayer).
        dynamic_img_size: accept other input sizes, resampling the position grid.
        init_values: LayerScale init; None disables LayerScale. With `res_post_norm` the
            blocks have no LayerScale and it is the initial scale of their norms (as timm).
        distilled: add DeiT's distillation token and head.
        token_init: 'trunc_normal' (std 0.02) or 'zeros' for class token and learned positions.
        norm_eps: epsilon of every norm.
        reg_tokens: register tokens after the class token (Darcet et al., "Vision Transformers
            Need Registers", 2024).
        no_embed_class: the position embedding covers the patches only; prefix tokens get none
            (DeiT III, FlexiViT, DINOv2 with registers).
        pre_norm: a norm before the encoder (`norm_pre`, as CLIP).
        final_norm: the norm after the encoder (or after pooling, with `fc_norm`); False drops
            it (RADIO, InternViT).
        patch_bias: bias in the patch projection (CLIP has none).
        dynamic_img_pad: with `dynamic_img_size`, pad the input right / bottom to whole
            patches instead of refusing it.
        pool_include_prefix: pool over the prefix tokens too (not for 'token').
        qk_norm: normalise queries and keys per head (Dehghani et al., ViT-22B, 2023).
        scale_attn_norm: a norm on the attention output before its projection (BEiT-3).
        scale_mlp_norm: a norm on the MLP hidden layer before its output (BEiT-3).
        proj_bias: biases in the attention output projection and the MLP layers.
        act_layer: the MLP activation: 'gelu' (exact erf), 'gelu_tanh' (tanh approximation),
            'quick_gelu' (x * sigmoid(1.702 x), OpenAI CLIP) or 'silu'.
        norm_layer: 'layernorm' or 'rmsnorm' (Zhang & Sennrich, 2019) for every norm.
        mlp_layer: 'mlp' (Linear, act, Linear), 'swiglu' (act(x W_g) * (x W_x), then a Linear;
            Shazeer, "GLU Variants Improve Transformer", 2020) with gate and value as separate
            layers `fc1_g` / `fc1_x`, or 'swiglu_packed', the same with both in one `fc1`
            (gate first) of width embed_dim * mlp_ratio, half of it gate.
        res_post_norm: norm each residual branch's output, x + norm(f(x)), instead of its
            input (Swin v2's res-post-norm; timm's `ResPostBlock`).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_chans: int = 3
    conv_stem: tuple[int, ...] = ()
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_scale: float | None = None
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    class_token: bool = True
    global_pool: str = "token"
    fc_norm: bool | None = None
    pos_embed: str = "learn"
    patch_embed: str = "conv"
    embed_norm: bool = False
    encoder: str = "native"
    dynamic_img_size: bool = False
    init_values: float | None = None
    distilled: bool = False
    token_init: str = "trunc_normal"
    norm_eps: float = 1e-6
    reg_tokens: int = 0
    no_embed_class: bool = False
    pre_norm: bool = False
    final_norm: bool = True
    patch_bias: bool = True
    dynamic_img_pad: bool = False
    pool_include_prefix: bool = False
    qk_norm: bool = False
    scale_attn_norm: bool = False
    scale_mlp_norm: bool = False
    proj_bias: bool = True
    act_layer: str = "gelu"
    norm_layer: str = "layernorm"
    mlp_layer: str = "mlp"
    res_post_norm: bool = False

    def __post_init__(self) -> None:
        for name, types in _FIELD_TYPES.items():
            value = getattr(self, name)
            bad_bool = isinstance(value, bool) and bool not in types
            if not isinstance(value, types) or bad_bool:
                expected = " or ".join(t.__name__ for t in types)
                raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
        for name in ("img_size", "patch_size"):
            value = getattr(self, name)
            if not isinstance(value, int):
                object.__setattr__(self, name, to_2tuple(value, name))
            else:
                to_2tuple(value, name)
        stem = tuple(self.conv_stem)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in stem):
            raise ValueError(f"conv_stem must be positive channel counts, got {self.conv_stem!r}")
        object.__setattr__(self, "conv_stem", stem)
        for name, (low, most) in SIZE_LIMITS.items():
            value = getattr(self, name)
            sides = value if isinstance(value, tuple) else (value,)
            if not all(low <= side <= most for side in sides):
                raise ValueError(f"{name} must be in [{low}, {most:,}], got {value}")
        for name in ("mlp_ratio", "qk_scale", "norm_eps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.init_values is not None and not (
            math.isfinite(self.init_values) and self.init_values >= 0
        ):
            raise ValueError(
                f"init_values must be a finite number >= 0 (0 or None: no LayerScale), got "
                f"{self.init_values}"
            )
        if int(self.embed_dim * self.mlp_ratio) < 1:
            raise ValueError(
                f"mlp_ratio {self.mlp_ratio} gives an MLP of width 0 for embed_dim "
                f"{self.embed_dim}; choose mlp_ratio >= {1 / self.embed_dim:.3g}"
            )
        if self.embed_dim * self.mlp_ratio > MAX_MLP_WIDTH:
            raise ValueError(
                f"mlp_ratio {self.mlp_ratio} gives an MLP of width "
                f"{self.embed_dim * self.mlp_ratio:,.0f} for embed_dim {self.embed_dim}; the "
                f"most is {MAX_MLP_WIDTH:,}"
            )
        height, width = to_2tuple(self.img_size, "img_size")
        patch_h, patch_w = to_2tuple(self.patch_size, "patch_size")
        patches = (stem_output_size(height, len(stem)) // patch_h) * (
            stem_output_size(width, len(stem)) // patch_w
        )
        if patches > MAX_PATCHES:
            raise ValueError(
                f"img_size {self.img_size} in patches of {self.patch_size} makes {patches:,} "
                f"patches; the most is {MAX_PATCHES:,}: use larger patches or a smaller image"
            )
        widest = SIZE_LIMITS["embed_dim"][1]
        if any(channels > widest for channels in stem):
            raise ValueError(f"conv_stem channels must be <= {widest:,}, got {stem}")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        check_choice("global_pool", self.global_pool, GLOBAL_POOLS)
        check_choice("pos_embed", self.pos_embed, POS_EMBED_KINDS)
        check_choice("patch_embed", self.patch_embed, PATCH_EMBED_KINDS)
        check_choice("encoder", self.encoder, ENCODERS)
        check_choice("token_init", self.token_init, TOKEN_INITS)
        check_choice("act_layer", self.act_layer, ACT_LAYERS)
        check_choice("norm_layer", self.norm_layer, NORM_LAYERS)
        check_choice("mlp_layer", self.mlp_layer, MLP_LAYERS)
        if self.mlp_layer == "swiglu_packed" and int(self.embed_dim * self.mlp_ratio) % 2:
            raise ValueError(
                f"mlp_layer='swiglu_packed' splits fc1 in halves, but embed_dim "
                f"{self.embed_dim} * mlp_ratio {self.mlp_ratio} is odd; choose an even width"
            )
        if self.encoder == "torch":
            changed = [
                f"{name}={getattr(self, name)!r}"
                for name, default in _NATIVE_BLOCK_DEFAULTS.items()
                if getattr(self, name) != default
            ]
            if changed:
                raise ValueError(
                    f"encoder='torch' (nn.TransformerEncoderLayer) cannot express "
                    f"{', '.join(changed)}; use encoder='native'"
                )
        if self.dynamic_img_pad and not self.dynamic_img_size:
            raise ValueError("dynamic_img_pad=True needs dynamic_img_size=True")
        if self.dynamic_img_pad and self.conv_stem:
            raise ValueError("dynamic_img_pad=True pads raw images; it cannot follow a conv_stem")
        if self.pool_include_prefix and self.global_pool == "token":
            raise ValueError("pool_include_prefix=True needs a global_pool other than 'token'")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                f"choose num_heads among the divisors of {self.embed_dim}"
            )
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")
        if self.distilled and self.global_pool != "token":
            raise ValueError("distilled=True needs global_pool='token' and class_token=True")
        if self.distilled and self.reg_tokens:
            raise ValueError("distilled=True takes no reg_tokens; use one or the other")

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at `img_size`."""
        return patch_grid(
            *to_2tuple(self.img_size, "img_size"),
            to_2tuple(self.patch_size, "patch_size"),
            len(self.conv_stem),
            "img_size",
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
            for name, default in _FAMILY_DEFAULTS.items()
            if getattr(self, name) != default
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (pairs become lists)."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViTConfig:
        """Build from a dict, naming unknown keys and their closest valid names."""
        if not isinstance(data, dict):
            raise TypeError(f"a ViTConfig is built from a dict, got {type(data).__name__}")
        check_option_names(data)
        return cls(**data)

    def replace(self, **overrides: Any) -> ViTConfig:
        """A copy with some fields changed (unknown names are reported)."""
        check_option_names(overrides)
        return dataclasses.replace(self, **overrides)


def check_option_names(options: dict[str, Any]) -> None:
    """Raise a TypeError for option names ViTConfig does not have, with close matches."""
    known = [f.name for f in dataclasses.fields(ViTConfig)]
    unknown = [key for key in options if key not in known]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=3)
            hints.append(f"{key!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise TypeError(
            f"unknown model option {', '.join(hints)}; valid options: {', '.join(known)}"
        )
