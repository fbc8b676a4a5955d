"""Weights from the `.npz` checkpoints of the two JAX ViT codebases: the original ViT code,
google-research/vision_transformer (`vit_jax/models_vit.py`: the ImageNet-21k `augreg`
releases), and google-research/big_vision (`models/vit.py`: SigLIP, FlexiViT, the plain
ViT-S/16 baselines).

The layouts are described in `from_jax`. Flax kernels are (in, out) and become PyTorch's
(out, in); q, k and v kernels are (D, heads, head_dim), so the head count is read from them,
not guessed. The mapping follows timm's `_load_weights` (`models/vision_transformer.py`), the
reference the tests compare with.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...model import ViTConfig
from ..checkpoint import CheckpointError, load_npz
from .layout import check_state_dict, infer_config
from .timm import arch_options

log = logging.getLogger(__name__)

# Where the image model's arrays sit: older vision_transformer files under `opt/target/`,
# big_vision classifiers under `params/`, two-tower models (SigLIP) under `params/img/`.
_JAX_PREFIXES = ("opt/target/", "params/img/", "params/")

# An encoder block's sub-modules, numbered by creation order in each codebase:
# (attention, norm before attention, norm before the MLP, MLP).
_BLOCK_NAMES = {
    "vision_transformer": (
        "MultiHeadDotProductAttention_1",
        "LayerNorm_0",
        "LayerNorm_2",
        "MlpBlock_3",
    ),
    "big_vision": ("MultiHeadDotProductAttention_0", "LayerNorm_0", "LayerNorm_1", "MlpBlock_0"),
}

# The position table: big_vision's own place, big_vision's pre-2022 place, the original code's.
_POS_KEYS = (
    "pos_embedding",
    "Transformer/pos_embedding",
    "Transformer/posembed_input/pos_embedding",
)

# What the arrays record exactly, so a timm name (`arch=`) does not override it.
_RECORDED = ("num_heads", "no_embed_class")


def from_jax(
    source: str | os.PathLike | Mapping[str, np.ndarray | Tensor],
    *,
    arch: str | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], ViTConfig]:
    """An `.npz` checkpoint of vision_transformer or big_vision (or its arrays as a dict).

    Layout: `embedding/kernel` (ph, pw, C, D); `cls` (absent unless the model pools the class
    token); the position table `pos_embedding` (big_vision) or
    `Transformer/posembed_input/pos_embedding`; per block `Transformer/encoderblock_N/` with
    `LayerNorm_0`, attention `{query,key,value}` kernels (D, heads, head_dim) and `out` (heads,
    head_dim, D), a second LayerNorm and an `MlpBlock` with `Dense_{0,1}` (numbered 1, 2, 3 in
    vision_transformer, 0, 1, 0 in big_vision; a scanned `Transformer/encoderblock/` with a
    leading depth axis is split); `Transformer/encoder_norm`; big_vision's attention-pool head
    `MAPHead_0` (`probe`, attention, `LayerNorm_0`, `MlpBlock_0`); `head`. The arrays may sit
    under `opt/target/`, `params/` or `params/img/` (the image tower of a two-tower model; the
    rest is ignored).

    Pooling follows the arrays: `MAPHead_0` -> 'map'; `cls` -> the class token; neither -> the
    mean of the patch tokens after the final norm ('gap'). A position table of only the patch
    grid with `cls` means the class token has no position (big_vision adds the table before
    prepending it): `no_embed_class=True`. big_vision without a table used its fixed 2-D
    sin-cos table: `pos_embed='sincos2d'` (pass `img_size`; 224 is assumed). The activation is
    not recorded: exact GELU is assumed, as timm builds these models (JAX's `nn.gelu` is the
    tanh approximation, which timm's SigLIP 2 names use); `arch=` or `act_layer=` say
    otherwise. A `pre_logits` representation layer is not supported: it is dropped together
    with the head it feeds (num_classes becomes 0), with a warning.

    Args:
        source: the `.npz` path, or its arrays.
        arch: a timm model name of `vitkit.list_models()` (e.g. 'vit_base_patch16_siglip_224'):
            the activation, norm epsilon and pooling come from it (`timm.ARCH_FIELDS`); the head
            count and class-token positions come from the arrays all the same.
        overrides: `ViTConfig` fields, over both (e.g. `act_layer='gelu_tanh'`, `img_size`).
    """
    arrays = load_npz(source) if isinstance(source, (str, os.PathLike)) else dict(source)
    prefix = next((p for p in _JAX_PREFIXES if f"{p}embedding/kernel" in arrays), "")
    if prefix:
        ignored = sum(not k.startswith(prefix) for k in arrays)
        if ignored:
            log.info("ignoring %d arrays outside %s (not the image model)", ignored, prefix)
        arrays = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    w = _split_scanned({k: _tensor(v) for k, v in arrays.items()})
    if "embedding/kernel" not in w:
        raise CheckpointError(
            "no 'embedding/kernel' array: not a ViT checkpoint of vision_transformer or "
            f"big_vision (first keys: {', '.join(list(w)[:5])}); pass a ViT .npz"
        )
    layout = (
        "big_vision"
        if "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel" in w
        else "vision_transformer"
    )
    out, num_heads = _map_arrays(w, _BLOCK_NAMES[layout])
    if w:
        keys = [prefix + k for k in sorted(w)]
        raise CheckpointError(
            f"{layout} arrays not understood: {', '.join(keys[:5])}"
            + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "")
            + "; vitkit's ViT has no such layer: remove them, or load a plain ViT checkpoint"
        )
    cfg: dict[str, Any] = {"num_heads": num_heads, "norm_eps": 1e-6}
    if "cls_token" not in out and "attn_pool.latent" not in out:
        cfg.update(global_pool="avg", fc_norm=False)  # 'gap': final norm, then the patch mean
    if layout == "big_vision" and "pos_embed" not in out:
        cfg["pos_embed"] = "sincos2d"  # big_vision's posemb='sincos2d' has no array
    if arch is not None:
        cfg.update({k: v for k, v in arch_options(arch).items() if k not in _RECORDED})
    elif "act_layer" not in overrides:
        log.info(
            "JAX weights without their model name (arch): assuming exact GELU (as timm); JAX's "
            "nn.gelu is the tanh approximation (act_layer 'gelu_tanh')"
        )
    cfg.setdefault("act_layer", "gelu")  # the attention pool's check asks for it
    cfg.update(overrides)
    config = infer_config(out, **cfg)
    check_state_dict(out, config, "JAX")
    return out, config


def _tensor(array: np.ndarray | Tensor) -> Tensor:
    """An array as a tensor (tensors, e.g. on the meta device for `inspect`, as they are)."""
    return array if isinstance(array, Tensor) else torch.from_numpy(np.ascontiguousarray(array))


def _split_scanned(w: dict[str, Tensor]) -> dict[str, Tensor]:
    """A scanned encoder (`Transformer/encoderblock/...`, arrays with a leading depth axis)
    as one `Transformer/encoderblock_N/...` per block."""
    scanned = "Transformer/encoderblock/"
    out = {k: v for k, v in w.items() if not k.startswith(scanned)}
    for key, stacked in w.items():
        if key.startswith(scanned):
            for i, array in enumerate(stacked.unbind(0)):  # (depth, ...) -> depth x (...)
                out[f"Transformer/encoderblock_{i}/{key[len(scanned) :]}"] = array
    return out


def _map_arrays(
    w: dict[str, Tensor], block_names: tuple[str, str, str, str]
) -> tuple[dict[str, Tensor], int | None]:
    """vitkit's state dict and the head count from the arrays, popping every one it maps (what
    is left in `w` was not understood)."""
    out: dict[str, Tensor] = {}

    def dense(ours: str, theirs: str) -> None:  # Flax kernel (in, out) -> weight (out, in)
        out[f"{ours}.weight"] = w.pop(f"{theirs}/kernel").T.contiguous()
        out[f"{ours}.bias"] = w.pop(f"{theirs}/bias")

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"] = w.pop(f"{theirs}/scale")
        out[f"{ours}.bias"] = w.pop(f"{theirs}/bias")

    def attention(theirs: str, proj: str) -> tuple[list[Tensor], list[Tensor], int]:
        """The q, k and v weights (out, in) and biases, and the head count; the output
        projection goes to `proj`."""
        q, k, v = (w.pop(f"{theirs}/{n}/kernel") for n in ("query", "key", "value"))  # (D,H,hd)
        biases = [f"{theirs}/{n}/bias" for n in ("query", "key", "value")]
        bias = [w.pop(b).flatten() for b in biases if b in w]  # each (D,)
        out[f"{proj}.weight"] = w.pop(f"{theirs}/out/kernel").flatten(0, 1).T.contiguous()
        out[f"{proj}.bias"] = w.pop(f"{theirs}/out/bias")
        return [t.flatten(1).T for t in (q, k, v)], bias, q.shape[1]  # weights (D_out, D_in)

    kernel = w.pop("embedding/kernel")
    if kernel.ndim != 4:
        raise CheckpointError(f"embedding/kernel has shape {tuple(kernel.shape)}, not 4-D")
    out["patch_embed.proj.weight"] = kernel.permute(3, 2, 0, 1).contiguous()  # (D, C, ph, pw)
    out["patch_embed.proj.bias"] = w.pop("embedding/bias")
    if "cls" in w:
        out["cls_token"] = w.pop("cls")
    pos_keys = [k for k in _POS_KEYS if k in w]
    if len(pos_keys) > 1:
        raise CheckpointError(f"two position tables ({', '.join(pos_keys)}); keep one")
    if pos_keys:
        out["pos_embed"] = w.pop(pos_keys[0]).reshape(1, -1, kernel.shape[-1])  # (1, N, D)
    depth = len({k.split("/")[1] for k in w if k.startswith("Transformer/encoderblock_")})
    mha, norm1, norm2, mlp = block_names
    num_heads = None
    for i in range(depth):
        pre, ours = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        norm(ours + "norm1", pre + norm1)
        weights, bias, num_heads = attention(pre + mha, ours + "attn.proj")
        out[ours + "attn.qkv.weight"] = torch.cat(weights)  # (3D, D)
        if len(bias) == 3:
            out[ours + "attn.qkv.bias"] = torch.cat(bias)  # (3D,)
        norm(ours + "norm2", pre + norm2)
        dense(ours + "mlp.fc1", f"{pre}{mlp}/Dense_0")
        dense(ours + "mlp.fc2", f"{pre}{mlp}/Dense_1")
    norm("norm", "Transformer/encoder_norm")
    if "MAPHead_0/probe" in w:
        out["attn_pool.latent"] = w.pop("MAPHead_0/probe")  # (1, 1, D)
        weights, bias, pool_heads = attention(
            "MAPHead_0/MultiHeadDotProductAttention_0", "attn_pool.proj"
        )
        out["attn_pool.q.weight"], out["attn_pool.kv.weight"] = weights[0], torch.cat(weights[1:])
        if len(bias) == 3:  # the pool's query is its own layer
            out["attn_pool.q.bias"], out["attn_pool.kv.bias"] = bias[0], torch.cat(bias[1:])
        if num_heads is not None and pool_heads != num_heads:
            raise CheckpointError(
                f"the MAP head has {pool_heads} attention heads and the blocks {num_heads}; "
                "vitkit's attention pool uses the blocks' count"
            )
        norm("attn_pool.norm", "MAPHead_0/LayerNorm_0")
        dense("attn_pool.mlp.fc1", "MAPHead_0/MlpBlock_0/Dense_0")
        dense("attn_pool.mlp.fc2", "MAPHead_0/MlpBlock_0/Dense_1")
    if "pre_logits/kernel" in w:
        log.warning(
            "the checkpoint has a pre_logits representation layer, which vitkit does not "
            "support; it is dropped with the head (num_classes=0): fine-tune a new head"
        )
        for key in ("pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"):
            w.pop(key, None)
    elif "head/kernel" in w:
        dense("head", "head")
    return out, num_heads
