"""The consistency rules of a `ViTConfig` (config.py), checked once when it is made: what
each field's type and range cannot say alone (widths that divide, tokens that a pooling needs,
what `encoder='torch'` and window attention can build). Each error says what to pass instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..options import default_of

if TYPE_CHECKING:
    from .config import ViTConfig

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
    changed = [f"{name}={getattr(config, name)!r}" for name in _NATIVE_ONLY
               if getattr(config, name) != default_of(type(config), name)]  # fmt: skip
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


def check_blocks(config: ViTConfig) -> None:
    if config.conv_stem_strides and len(config.conv_stem_strides) != len(config.conv_stem):
        raise ValueError(
            f"conv_stem_strides has {len(config.conv_stem_strides)} strides for "
            f"{len(config.conv_stem)} conv_stem layers; give one per layer"
        )
    if config.hybrid_layers and config.hybrid == "none":
        raise ValueError("hybrid_layers needs hybrid='resnetv2'")
    if config.hybrid != "none" and config.conv_stem:
        raise ValueError("hybrid and conv_stem are two stems; pass one of them")
    if config.hybrid != "none" and config.dynamic_img_pad:
        raise ValueError("dynamic_img_pad=True pads raw images; it cannot follow a hybrid stem")
    if config.block == "parallel_things" and config.attn_layer != "attn":
        raise ValueError("block='parallel_things' has plain attention only (as timm)")
    scaling_lacks = (config.scale_attn_norm, config.scale_mlp_norm, config.mlp_layer != "mlp",
                     config.qk_scale is not None)  # fmt: skip
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
