"""Weights from the `.npz` checkpoints of the original ViT code, google-research/vision_transformer
(`vit_jax/models_vit.py`, Flax), such as the ImageNet-21k `augreg` releases.

The layout is described in `from_jax`. Flax kernels are (in, out) and become PyTorch's
(out, in); q, k and v kernels are (D, heads, head_dim), so the head count is read from them,
not guessed. big_vision checkpoints (`params/...` with other names) are not supported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model import ViTConfig
from .checkpoint import CheckpointError, load_npz
from .layout import check_state_dict, infer_config

log = logging.getLogger(__name__)

_JAX_PREFIXES = ("opt/target/",)  # older checkpoints nest the weights here


def from_jax(
    source: str | os.PathLike | Mapping[str, np.ndarray], **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """An `.npz` checkpoint of the original ViT code (or its arrays as a dict).

    Layout: `embedding/kernel` (ph, pw, C, D); `cls`; `Transformer/posembed_input/pos_embedding`;
    per block `Transformer/encoderblock_N/` with `LayerNorm_0`, `MultiHeadDotProductAttention_1/
    {query,key,value}` kernels (D, heads, head_dim) and `out` (heads, head_dim, D),
    `LayerNorm_2`, `MlpBlock_3/Dense_{0,1}`; `Transformer/encoder_norm`; `head`. Kernels are
    (in, out) and are transposed to PyTorch's (out, in). The head count is read from the
    query kernel. Without `cls` the model pools by mean after the final norm (the paper's
    'gap' classifier). A `pre_logits` representation layer is not supported: it is dropped
    together with the head it feeds (num_classes becomes 0), with a warning.
    """
    arrays = load_npz(source) if isinstance(source, (str, os.PathLike)) else dict(source)
    for prefix in _JAX_PREFIXES:
        if f"{prefix}embedding/kernel" in arrays:
            arrays = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    if "embedding/kernel" not in w:
        raise CheckpointError(
            "no 'embedding/kernel' array: not a ViT checkpoint in the original JAX layout "
            f"(first keys: {', '.join(list(w)[:5])}); big_vision checkpoints are not supported"
        )
    out: dict[str, Tensor] = {}

    def take(key: str) -> Tensor:
        return w.pop(key)

    def dense(ours: str, theirs: str) -> None:  # Flax kernel (in, out) -> weight (out, in)
        out[f"{ours}.weight"] = take(f"{theirs}/kernel").T.contiguous()
        out[f"{ours}.bias"] = take(f"{theirs}/bias")

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"] = take(f"{theirs}/scale")
        out[f"{ours}.bias"] = take(f"{theirs}/bias")

    kernel = take("embedding/kernel")
    if kernel.ndim != 4:
        raise CheckpointError(f"embedding/kernel has shape {tuple(kernel.shape)}, not 4-D")
    out["patch_embed.proj.weight"] = kernel.permute(3, 2, 0, 1).contiguous()  # (D, C, ph, pw)
    out["patch_embed.proj.bias"] = take("embedding/bias")
    if "cls" in w:
        out["cls_token"] = take("cls")
    if "Transformer/posembed_input/pos_embedding" in w:
        out["pos_embed"] = take("Transformer/posembed_input/pos_embedding")
    depth = len({k.split("/")[1] for k in w if k.startswith("Transformer/encoderblock_")})
    num_heads = None
    for i in range(depth):
        pre, ours = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = pre + "MultiHeadDotProductAttention_1/"
        norm(ours + "norm1", pre + "LayerNorm_0")
        q, k, v = (take(f"{mha}{n}/kernel") for n in ("query", "key", "value"))  # (D, H, hd)
        num_heads = q.shape[1]
        out[ours + "attn.qkv.weight"] = torch.cat([t.flatten(1).T for t in (q, k, v)])  # (3D, D)
        biases = [f"{mha}{n}/bias" for n in ("query", "key", "value")]
        if all(b in w for b in biases):
            out[ours + "attn.qkv.bias"] = torch.cat([take(b).flatten() for b in biases])  # (3D,)
        out[ours + "attn.proj.weight"] = take(mha + "out/kernel").flatten(0, 1).T.contiguous()
        out[ours + "attn.proj.bias"] = take(mha + "out/bias")
        norm(ours + "norm2", pre + "LayerNorm_2")
        dense(ours + "mlp.fc1", pre + "MlpBlock_3/Dense_0")
        dense(ours + "mlp.fc2", pre + "MlpBlock_3/Dense_1")
    norm("norm", "Transformer/encoder_norm")
    if "pre_logits/kernel" in w:
        log.warning(
            "the checkpoint has a pre_logits representation layer, which vitkit does not "
            "support; it is dropped with the head (num_classes=0): fine-tune a new head"
        )
        for key in ("pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"):
            w.pop(key, None)
    elif "head/kernel" in w:
        dense("head", "head")
    if w:
        raise CheckpointError(
            f"JAX arrays not understood: {', '.join(sorted(w)[:5])}"
            + (f", ... ({len(w)} in all)" if len(w) > 5 else "")
        )
    cfg: dict[str, Any] = {"num_heads": num_heads, "norm_eps": 1e-6}
    if "cls_token" not in out:  # 'gap': final norm, then the mean of the patch tokens
        cfg.update(global_pool="avg", fc_norm=False)
    cfg.update(overrides)
    config = infer_config(out, **cfg)
    check_state_dict(out, config, "JAX")
    return out, config
