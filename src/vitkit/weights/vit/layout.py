"""vitkit's key layout, which timm's `vision_transformer.py` shares: config inference from the
weights, the expected shapes of a config, and the key / shape check every converter ends with.

This is its own module, not part of `timm.py`, because every source uses it: the Hugging Face,
torchvision and JAX converters map their keys into this layout, then call `infer_config` and
`check_state_dict` here, and the exporters start from `native_state_dict`. Keeping it apart
means `hf.py` does not import `timm.py` to reach code that is not about timm.

The config is inferred from the weights: embed_dim, depth, MLP width and kind (plain, SwiGLU,
packed SwiGLU, GeGLU), patch size and bias, input channels, a hybrid's CNN stem, class /
distillation / register tokens, `norm_pre`, final norm vs `fc_norm` (or none), LayerScale, q/k
and per-branch norms, LayerNorm vs RMSNorm, projection biases, the attention-pool head, number
of classes, and the resolution from the position-embedding grid (assumed square; pass `img_size`
for a non-square grid), which also tells whether the prefix tokens have positions
(`no_embed_class`). What the weights cannot show (the activation, pre- or post-norm blocks, the
norm epsilon, mean / max pooling) comes from `overrides`, or from a timm model name (`arch=` of
`from_timm`); weights of families where the usual guess is often wrong (CLIP's `norm_pre`,
SigLIP's attention pool, RMSNorm) are refused without them. The number of attention heads leaves
no trace in timm, Hugging Face or torchvision weights (q, k and v are stored as full D x D
matrices), so it comes from, in order: the `num_heads` argument, a Hugging Face `config.json`
when one is given, the standard head count for the width (192 -> 3, 384 -> 6, 768 -> 12,
1024 -> 16, 1280 -> 16; ViT paper Table 1 and DeiT); another width is refused
(`default_num_heads`), never guessed. The JAX layout stores heads explicitly, so there it is
exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...model import VisionTransformer, ViTConfig
from ...model.layers.patch_embed import to_2tuple
from ...model.vit.config import hybrid_strides
from ...model.vit.torch_encoder import torch_to_native_state_dict
from ..checkpoint import CheckpointError, MissingOptionError, mismatch_report

# embed_dim -> heads of the standard sizes (ViT paper Table 1; Ti and S from DeiT).
STANDARD_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}

# The stem convolution of timm's hybrid ResNetV2, whole or stem-only (layers/resnetv2.py).
_HYBRID_STEMS = ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight")
# ViTamin's stem (layers/mbconv.py): its first convolution, and the last, which projects to the
# width in place of `patch_embed.proj`.
MBCONV_STEM = "patch_embed.backbone.stem.conv1.weight"
MBCONV_PROJ = "patch_embed.backbone.pool.proj.weight"

# The first norm of the first block: `Block`'s, the parallel blocks' (layers/parallel.py).
_FIRST_NORMS = ("blocks.0.norm1", "blocks.0.in_norm", "blocks.0.attns.0.norm")
# timm's ParallelThingsBlock's first branches, renamed to `Block`'s keys for the inference.
_PARALLEL_THINGS = {"attns.0.norm.": "norm1.", "attns.0.attn.": "attn.", "attns.0.ls.": "ls1.",
                    "ffns.0.norm.": "norm2.", "ffns.0.mlp.": "mlp."}  # fmt: skip

# Placeholder LayerScale init for converted models: the loaded gammas replace it.
_LAYER_SCALE_INIT = 1e-5

# timm layers vitkit does not have, named in the error message.
_UNSUPPORTED = {
    "blocks.0.attn.gate.weight": "gated attention (attn.gate)",
    "attn_pool.pos_embed": "an attention pool with its own position embedding",
    "attn_pool.q_norm.weight": "an attention pool with q/k norms",
}

# Weights whose family chose options the weights do not show, differently from model to model:
# (marker key, the family, the options that must be given). RMSNorm's marker is a norm
# without bias.
_NEEDS_OPTIONS = (
    ("norm_pre.weight", "CLIP-style norm_pre", ("act_layer", "norm_eps")),
    ("attn_pool.latent", "an attention-pool (SigLIP) head", ("act_layer",)),
    ("rmsnorm", "RMSNorm", ("norm_eps",)),
)


def default_num_heads(embed_dim: int) -> int:
    """The head count of a standard width (ViT paper Table 1, DeiT) when the weights do not
    say; any other width is refused, never guessed: a wrong count computes another function."""
    if embed_dim in STANDARD_HEADS:
        return STANDARD_HEADS[embed_dim]
    raise MissingOptionError(
        f"the weights do not record the number of attention heads and width {embed_dim} is not "
        f"a standard ViT size ({', '.join(map(str, STANDARD_HEADS))})",
        ("num_heads",),
    )


# -- config inference -----------------------------------------------------------------------


def infer_config(state_dict: Mapping[str, Tensor], **overrides: Any) -> ViTConfig:
    """The `ViTConfig` of a state dict in vitkit / timm layout; `overrides` win.

    Besides `ViTConfig` fields, `overrides` may hold `num_heads=None` (use the default). Only
    key names and shapes are read, so tensors on the meta device do (`weights.inspect`).
    """
    sd = state_dict
    _check_supported(sd, overrides)
    if MBCONV_PROJ in sd:
        cfg = _mbconv_options(sd)
    else:
        cfg = _patch_options(sd["patch_embed.proj.weight"], overrides)
        cfg.update(_hybrid_options(sd))
    cfg.update(_block_options(sd, cfg["embed_dim"]))
    cfg.update(_token_options(sd))
    num_heads = overrides.pop("num_heads", None)
    cfg["num_heads"] = num_heads or default_num_heads(cfg["embed_dim"])
    cfg.update(overrides)
    if "img_size" not in overrides or "no_embed_class" not in overrides:
        _grid_from_pos_embed(sd, cfg, img_given="img_size" in overrides)
    if cfg["global_pool"] == "token" and not cfg["class_token"]:
        cfg["global_pool"] = "avg"
    if "fc_norm" not in overrides:  # None: the default rule (fc_norm for avg / max) holds
        has_fc_norm = "fc_norm.weight" in sd
        default_rule = has_fc_norm == (cfg["global_pool"] in ("avg", "avgmax", "max"))
        cfg["fc_norm"] = None if default_rule or not cfg["final_norm"] else has_fc_norm
    return ViTConfig.from_dict(cfg)


def _check_supported(sd: Mapping[str, Tensor], overrides: dict[str, Any]) -> None:
    """Refuse weights that are no ViT, that have layers vitkit lacks, or whose family chose
    options the weights do not show and `overrides` do not give (RMSNorm is named in them)."""
    if "patch_embed.proj.weight" not in sd and MBCONV_PROJ not in sd:
        raise CheckpointError(
            "no 'patch_embed.proj.weight' in the state dict; it is not a ViT in timm / vitkit "
            f"layout (first keys: {', '.join(list(sd)[:5])})"
        )
    unsupported = [what for key, what in _UNSUPPORTED.items() if key in sd]
    if unsupported:
        raise CheckpointError(
            f"the weights have {', '.join(unsupported)}, which vitkit's ViT does not support"
        )
    markers = set(sd)
    norm = next((k for k in _FIRST_NORMS if k + ".weight" in sd), _FIRST_NORMS[0])
    if norm + ".weight" in sd and norm + ".bias" not in sd:
        markers.add("rmsnorm")
        overrides.setdefault("norm_layer", "rmsnorm")
    for marker, family, options in _NEEDS_OPTIONS:
        missing = tuple(name for name in options if name not in overrides)
        if marker in markers and missing:
            raise MissingOptionError(
                f"the weights have {family}, whose {' and '.join(missing)} they do not record",
                ("arch",),
                missing,
            )


def _patch_options(proj: Tensor, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """embed_dim, in_chans, patch_size (and patch_embed='unfold') from the patch projection."""
    embed_dim = proj.shape[0]
    if proj.ndim == 4:  # (D, C, ph, pw)
        return {
            "embed_dim": embed_dim,
            "in_chans": proj.shape[1],
            "patch_size": _int_if_square(tuple(proj.shape[2:])),
        }
    if proj.ndim != 2:
        raise CheckpointError(f"patch_embed.proj.weight has unexpected shape {tuple(proj.shape)}")
    # (D, C*ph*pw): patch_embed='unfold'
    in_chans = overrides.get("in_chans", 3)
    patch = overrides.get("patch_size") or math.isqrt(proj.shape[1] // in_chans)
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    if in_chans * ph * pw != proj.shape[1]:
        raise MissingOptionError(
            f"cannot tell the patch size of a linear patch embedding of width {proj.shape[1]}",
            ("in_chans", "patch_size"),
        )
    return {
        "embed_dim": embed_dim,
        "patch_embed": "unfold",
        "in_chans": in_chans,
        "patch_size": _int_if_square((ph, pw)),
    }


def _hybrid_options(sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """timm's hybrid ResNetV2 (`patch_embed.backbone.stem.conv` and `stages.S.blocks.B`, or
    its stem alone, `patch_embed.backbone.conv`): the blocks per stage and the input channels."""
    stem = next((k for k in _HYBRID_STEMS if k in sd), None)
    if stem is None:
        return {}
    blocks: dict[int, int] = {}
    for key in sd:
        if match := re.match(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", key):
            stage, block = int(match[1]), int(match[2])
            blocks[stage] = max(blocks.get(stage, 0), block + 1)
    layers = tuple(blocks.get(stage, 0) for stage in range(len(blocks)))
    return {"hybrid": "resnetv2", "hybrid_layers": layers, "in_chans": sd[stem].shape[1]}


def _mbconv_options(sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """ViTamin's stem (`stem.conv1`, `stages.S.B.conv2_kxk`, `pool.proj`): the width, the blocks
    and channels per stage and the input channels; patches of one feature-map pixel."""
    blocks: dict[int, int] = {}
    for key in sd:
        if match := re.match(
            r"patch_embed\.backbone\.stages\.(\d+)\.(\d+)\.conv3_1x1\.weight", key
        ):
            stage, block = int(match[1]), int(match[2])
            blocks[stage] = max(blocks.get(stage, 0), block + 1)
    stages = range(len(blocks))
    return {
        "embed_dim": sd[MBCONV_PROJ].shape[0],
        "in_chans": sd[MBCONV_STEM].shape[1],
        "patch_size": 1,
        "hybrid": "mbconv",
        "hybrid_layers": tuple(blocks.get(s, 0) for s in stages),
        "hybrid_widths": tuple(
            sd[f"patch_embed.backbone.stages.{s}.0.conv3_1x1.weight"].shape[0] for s in stages
        ),
    }


def _block_options(sd: Mapping[str, Tensor], embed_dim: int) -> dict[str, Any]:
    """depth, the MLP, biases, norms and LayerScale of the encoder blocks."""
    block_ids = {int(m[1]) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))}
    if not block_ids:
        raise CheckpointError("no 'blocks.N.' weights in the state dict; it has no encoder blocks")
    no_proj = "patch_embed.proj.weight" not in sd  # ViTamin's stem projects: the default holds
    kind = {"depth": max(block_ids) + 1, "patch_bias": no_proj or "patch_embed.proj.bias" in sd}
    if "blocks.0.in_proj.weight" in sd:
        return {**kind, **_parallel_scaling_options(sd, embed_dim)}
    if "blocks.0.attns.0.attn.qkv.weight" in sd:
        kind["block"] = "parallel_things"
        sd = {_renamed(k, _PARALLEL_THINGS): v for k, v in sd.items() if k.startswith("blocks.0.")}
    return {
        **kind,
        "attn_layer": "diff" if "blocks.0.attn.lambda_q1" in sd else "attn",
        **_mlp_options(sd, embed_dim),
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd,
        "proj_bias": "blocks.0.attn.proj.bias" in sd,
        "qk_norm": "blocks.0.attn.q_norm.weight" in sd,
        "scale_attn_norm": "blocks.0.attn.norm.weight" in sd,
        "scale_mlp_norm": "blocks.0.mlp.norm.weight" in sd and "blocks.0.mlp.w0.weight" not in sd,
        "init_values": _LAYER_SCALE_INIT if "blocks.0.ls1.gamma" in sd else None,
    }


def _parallel_scaling_options(sd: Mapping[str, Tensor], embed_dim: int) -> dict[str, Any]:
    """timm's ParallelScalingBlock (differential: with lambdas): one `in_proj` for the MLP's
    hidden layer, q, k and v."""
    hidden = sd["blocks.0.in_proj.weight"].shape[0] - 3 * embed_dim
    return {
        "block": "parallel_scaling",
        "attn_layer": "diff" if "blocks.0.lambda_q1" in sd else "attn",
        "mlp_ratio": hidden / embed_dim,
        "qkv_bias": "blocks.0.in_proj.bias" in sd,
        "proj_bias": "blocks.0.attn_out_proj.bias" in sd or "blocks.0.out_proj.bias" in sd,
        "qk_norm": "blocks.0.q_norm.weight" in sd,
        "init_values": _LAYER_SCALE_INIT if "blocks.0.ls.gamma" in sd else None,
    }


def _renamed(key: str, names: Mapping[str, str]) -> str:
    """`key` of the first block with its first matching prefix in `names` replaced."""
    for theirs, ours in names.items():
        if key.startswith("blocks.0." + theirs):
            return "blocks.0." + ours + key[len("blocks.0." + theirs) :]
    return key


def _token_options(sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """The prefix tokens, norms around the encoder, the head and the pooling."""
    class_token = "cls_token" in sd
    has_fc_norm = "fc_norm.weight" in sd
    if "attn_pool.latent" in sd:
        pool = "map"
    else:
        pool = "token" if class_token and not has_fc_norm else "avg"
    return {
        "embed_norm": "patch_embed.norm.weight" in sd,
        "pre_norm": "norm_pre.weight" in sd,
        "class_token": class_token,
        "distilled": "dist_token" in sd,
        "reg_tokens": sd["reg_token"].shape[1] if "reg_token" in sd else 0,
        "num_classes": sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        "final_norm": has_fc_norm or "norm.weight" in sd,
        "global_pool": pool,
        "pos_embed": "learn" if "pos_embed" in sd else "none",
    }


def _mlp_options(sd: Mapping[str, Tensor], embed_dim: int) -> dict[str, Any]:
    """mlp_layer and mlp_ratio from the MLP's weights: split gate and value layers (`fc1_g`,
    `fc1_x`) are SwiGLU; an `fc1` twice as wide as `fc2`'s input is the packed SwiGLU."""
    if "blocks.0.mlp.w0.weight" in sd:  # ViTamin's GeGLU, normed at its input
        hidden = sd["blocks.0.mlp.w0.weight"].shape[0]
        return {"mlp_layer": "geglu", "act_layer": "gelu", "mlp_ratio": hidden / embed_dim}
    if "blocks.0.mlp.fc1_g.weight" in sd:
        hidden = sd["blocks.0.mlp.fc1_g.weight"].shape[0]
        return {"mlp_layer": "swiglu", "act_layer": "silu", "mlp_ratio": hidden / embed_dim}
    hidden = sd["blocks.0.mlp.fc1.weight"].shape[0]
    if hidden == 2 * sd["blocks.0.mlp.fc2.weight"].shape[1]:
        return {"mlp_layer": "swiglu_packed", "act_layer": "silu", "mlp_ratio": hidden / embed_dim}
    return {"mlp_ratio": hidden / embed_dim}


def _grid_from_pos_embed(sd: Mapping[str, Tensor], cfg: dict[str, Any], img_given: bool) -> None:
    """Set `img_size` (the resolution whose patch grid the position embedding covers, square
    unless given) and `no_embed_class` (whether the prefix tokens have positions) in `cfg`."""
    patch = cfg["patch_size"]
    stride = 2 ** hybrid_strides(cfg.get("hybrid", "none"), cfg.get("hybrid_layers", ()))
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    ph, pw = ph * stride, pw * stride  # image pixels per token
    if "pos_embed" not in sd:
        if not img_given:
            cfg["img_size"] = _int_if_square((224 // ph * ph, 224 // pw * pw))
        return
    prefix = int(cfg["class_token"]) + int(cfg["distilled"]) + cfg["reg_tokens"]
    length = sd["pos_embed"].shape[1]
    if img_given:
        h, w = to_2tuple(cfg["img_size"], "img_size")
        cfg.setdefault("no_embed_class", prefix > 0 and length == (h // ph) * (w // pw))
        return
    options = [False, True] if prefix else [False]
    if "no_embed_class" in cfg:
        options = [cfg["no_embed_class"]]
    fits = {
        no_embed: math.isqrt(length - (0 if no_embed else prefix))
        for no_embed in options
        if math.isqrt(length - (0 if no_embed else prefix)) ** 2
        == length - (0 if no_embed else prefix)
    }
    if len(fits) != 1:
        found = "fits both" if fits else "is not a square grid"
        raise MissingOptionError(
            f"the position embedding's {length} positions ({prefix} prefix tokens) {found}: "
            "give the resolution the weights were trained at"
            + (" or whether the prefix tokens have positions" if prefix else ""),
            ("img_size",),
            *((("no_embed_class",),) if prefix else ()),
        )
    ((no_embed, side),) = fits.items()
    cfg["no_embed_class"] = no_embed
    cfg["img_size"] = _int_if_square((side * ph, side * pw))


def _int_if_square(pair: tuple[int, int]) -> int | tuple[int, int]:
    return pair[0] if pair[0] == pair[1] else pair


# -- the shape check ------------------------------------------------------------------------


def input_conv(config: ViTConfig) -> str:
    """The weight that takes the image (`ViTConfig.first_conv`)."""
    return config.first_conv + ".weight"


def expected_shapes(config: ViTConfig) -> dict[str, torch.Size]:
    """Key -> shape of `VisionTransformer(config).state_dict()`, from a one-block probe built on
    the meta device (no memory allocated), its block keys repeated `depth` times; ViTDet's
    `global_blocks` from a probe of their own (their relative-position tables differ)."""
    with torch.device("meta"):
        probes = [VisionTransformer(config.replace(depth=1, drop_path_rate=0.0, global_blocks=()))]
        if config.global_blocks:
            probes.append(VisionTransformer(config.replace(depth=1, global_blocks=(0,))))
    shapes = {}
    for kind, probe in enumerate(probes):  # 0: the other blocks, 1: the global blocks
        for key, value in probe.state_dict().items():
            match = re.fullmatch(r"blocks\.(layers\.)?0\.(.+)", key)
            if match is None:
                shapes[key] = value.shape
                continue
            for i in range(config.depth):
                if (i in config.global_blocks) == (kind == 1):
                    shapes[f"blocks.{match[1] or ''}{i}.{match[2]}"] = value.shape
    return shapes


def saved_shapes_problem(config: ViTConfig, shapes: Mapping[str, Sequence[int]]) -> str | None:
    """How a saved config and its file's tensor shapes disagree (None: they agree), the block
    count first: a claimed depth allocates the expected shapes' table."""
    blocks = {int(m[1]) for k in shapes if (m := re.match(r"blocks\.(?:layers\.)?(\d+)\.", k))}
    if len(blocks) != config.depth:
        return f"its config says depth {config.depth} but the file holds {len(blocks)} blocks"
    report = mismatch_report(expected_shapes(config), shapes)
    return f"its config does not match its tensors ({report})" if report else None


def check_state_dict(state_dict: Mapping[str, Tensor], config: ViTConfig, source: str) -> None:
    """Raise a CheckpointError unless `state_dict` has exactly the keys and shapes of
    `VisionTransformer(config)`."""
    report = mismatch_report(expected_shapes(config), dict(state_dict))
    if report:
        raise CheckpointError(
            f"{source} weights do not fit the inferred config ({report}); pass the options "
            "that differ (e.g. num_heads=, img_size=) or report the unsupported layers"
        )


# -- the exporters' starting point ----------------------------------------------------------


def native_state_dict(
    model_or_state_dict: nn.Module | Mapping[str, Tensor], config: ViTConfig | None
) -> tuple[dict[str, Tensor], ViTConfig]:
    """(state dict in the native layout, config) of a model, or of a state dict with its config:
    detached copies, `encoder='torch'` keys renamed to the native blocks', an unfold patch
    embedding reshaped to the convolution's (D, C, ph, pw). The exporters start from this."""
    if isinstance(model_or_state_dict, nn.Module):
        config = config or model_or_state_dict.config
        sd = dict(model_or_state_dict.state_dict())
    elif config is None:
        raise ValueError("pass the model, or the state dict together with its ViTConfig")
    else:
        sd = dict(model_or_state_dict)
    sd = {k: v.detach().clone() for k, v in sd.items()}
    if config.encoder == "torch":
        sd = torch_to_native_state_dict(sd)
    if config.patch_embed == "unfold":
        weight = sd["patch_embed.proj.weight"]  # (D, C*ph*pw) -> (D, C, ph, pw)
        ph, pw = to_2tuple(config.patch_size, "patch_size")
        sd["patch_embed.proj.weight"] = weight.reshape(weight.shape[0], config.in_chans, ph, pw)
    return sd, config
