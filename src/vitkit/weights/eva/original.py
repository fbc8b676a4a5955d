"""EVA weights in their original layouts, moved to timm's keys as timm's `checkpoint_filter_fn`
(`eva.py`) moves them, as pure functions (state dict in, state dict out; the resampling to
another size is `pretrained.py`'s): Meta's DINOv3 (`storage_tokens`, `ls1.gamma`, one
`qkv.bias`), Meta's Perception Encoder (`conv1`, `transformer.resblocks.`, `attn_pool.probe`),
Sapiens2 (`attn.wq`, `ffn.w12`), and BAAI's EVA / EVA-02 and OpenCLIP's (`mlp.ffn_ln`,
`attn.inner_attn_ln`, `mlp.w12`, a `visual.` / `visual.trunk.` prefix; MIM pre-training
checkpoints without their mask token and LM head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

# PE's names -> timm's, in timm's order (each applied to every key, one after the other).
_PE_SWAPS = (
    ("conv1", "patch_embed.proj"),
    ("positional_embedding", "pos_embed"),
    ("transformer.resblocks.", "blocks."),
    ("ln_pre", "norm_pre"),
    ("ln_post", "norm"),
    ("ln_", "norm"),
    ("ls_1.gamma", "gamma_1"),
    ("ls_2.gamma", "gamma_2"),
    ("in_proj_", "qkv."),
    ("out_proj", "proj"),
    ("mlp.c_fc", "mlp.fc1"),
    ("mlp.c_proj", "mlp.fc2"),
)
_SAPIENS2_SWAPS = (
    ("storage_tokens", "reg_token"),
    ("patch_embed.projection.", "patch_embed.proj."),
    ("attn.wq.", "attn.q_proj."),
    ("attn.wk.", "attn.k_proj."),
    ("attn.wv.", "attn.v_proj."),
    ("attn.gamma.weight", "gamma_1"),  # attention-only LayerScale, inside attn originally
    (".ffn.", ".mlp."),
    (".ln1.", ".norm1."),
    (".ln2.", ".norm2."),
)
# Names every layout shares with EVA's originals (BAAI): the MLP's and the attention's norms,
# SwiGLU's projections.
_EVA_SWAPS = (
    ("mlp.ffn_ln", "mlp.norm"),
    ("attn.inner_attn_ln", "attn.norm"),
    ("mlp.w12", "mlp.fc1"),
    ("mlp.w1", "mlp.fc1_g"),
    ("mlp.w2", "mlp.fc1_x"),
    ("mlp.w3", "mlp.fc2"),
)
_MIM_ONLY = ("mask_token", "lm_head.weight", "lm_head.bias")


def original_keys(keys: Sequence[str]) -> bool:
    """Whether the keys are an original layout this module moves (not timm's own)."""
    keys = set(keys)
    return (
        "storage_tokens" in keys
        or any(k.startswith(("conv1.", "visual.conv1.")) for k in keys)
        and any(".resblocks.0." in k for k in keys)
        or "visual.pos_embed" in keys
        or "visual.trunk.pos_embed" in keys
        or any(k.startswith("blocks.0.") and k.endswith(_ORIGINAL_BLOCK_ENDS) for k in keys)
    )


_ORIGINAL_BLOCK_ENDS = (".mlp.ffn_ln.weight", ".attn.inner_attn_ln.weight", ".mlp.w12.weight",
                        ".mlp.w1.weight", ".mlp.w3.weight", ".attn.wq.weight")  # fmt: skip


def pe_layout(state_dict: Mapping[str, Tensor], prefix: str = "visual.") -> dict[str, Tensor]:
    """Meta's Perception Encoder (`conv1`, `transformer.resblocks.`, the attention pool's
    `probe` and packed `in_proj`, the output `proj` as a head without bias) in timm's keys."""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        key = key.replace("module.", "")
        if prefix:
            if not key.startswith(prefix):
                continue
            key = key[len(prefix) :]
        for old, new in _PE_SWAPS:
            key = key.replace(old, new)
        if key.startswith("attn_pool"):
            key = key.replace("attn_pool.attn", "attn_pool")
            key = key.replace("attn_pool.layernorm", "attn_pool.norm")
            key = key.replace("attn_pool.probe", "attn_pool.latent")
            if key.startswith("attn_pool.qkv"):
                dim = value.shape[0] // 3  # packed (3 D, ...) -> q (D, ...), kv (2 D, ...)
                leaf = key.rsplit(".", 1)[1]
                out[f"attn_pool.q.{leaf}"], out[f"attn_pool.kv.{leaf}"] = value[:dim], value[dim:]
                continue
        elif key == "proj":  # (D, classes): the projection, a head without bias
            key, value = "head.weight", value.transpose(0, 1)
            out["head.bias"] = torch.zeros(value.shape[0], dtype=value.dtype)
        elif key == "class_embedding":
            key, value = "cls_token", value.unsqueeze(0).unsqueeze(1)  # (D,) -> (1, 1, D)
        elif key == "pos_embed":
            value = value.unsqueeze(0)  # (N, D) -> (1, N, D)
        out[key] = value
    return out


def _dinov3_key(key: str, value: Tensor, qkv_bias: bool) -> dict[str, Tensor]:
    """One DINOv3 tensor under timm's names: the packed qkv bias split into EVA's q / v biases
    (the keys' third stays zero), or dropped for a model without biases."""
    if key.endswith((".periods", ".bias_mask", "mask_token")):
        return {}  # buffers and pre-training only
    if key.startswith(("projectors.", "local_cls_norm")):
        return {}  # distillation heads, the 7B's local-crop norm
    if key.endswith("qkv.bias"):
        if not qkv_bias:
            return {}
        q, _, v = value.chunk(3, dim=-1)
        return {key.replace("qkv.bias", "q_bias"): q, key.replace("qkv.bias", "v_bias"): v}
    key = key.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2")
    return {key.replace("storage_tokens", "reg_token"): value}


def timm_eva_layout(
    state_dict: Mapping[str, Tensor], *, qkv_bias: bool = True
) -> dict[str, Tensor]:
    """Any layout timm's `checkpoint_filter_fn` reads, in timm's keys (timm's own unchanged).

    Args:
        state_dict: the weights.
        qkv_bias: whether the model has attention biases (DINOv3's distilled models were
            trained with biases that stayed zero: timm builds them with and without).
    """
    if "visual.conv1.weight" in state_dict:
        return pe_layout(state_dict)
    if "conv1.weight" in state_dict:
        return pe_layout(state_dict, prefix="")
    prefix = ""
    if "visual.trunk.pos_embed" in state_dict:
        prefix = "visual.trunk."
    elif "visual.pos_embed" in state_dict:
        prefix = "visual."
    sapiens2 = "blocks.0.attn.wq.weight" in state_dict and "blocks.0.ffn.w12.weight" in state_dict
    dinov3 = "storage_tokens" in state_dict and not sapiens2
    mim = not dinov3 and prefix + "mask_token" in state_dict
    no_qkv = prefix + "blocks.0.attn.q_proj.weight" in state_dict
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if prefix:
            if not key.startswith(prefix):
                continue
            key = key[len(prefix) :]
        if "rope" in key and key != "rope.freqs":
            continue  # fixed embeddings, computed by the model
        if sapiens2:
            if key == "mask_token":
                continue
            for old, new in _SAPIENS2_SWAPS:
                key = key.replace(old, new)
            if key.startswith("ln1."):
                key = "norm." + key[len("ln1.") :]  # the final norm
        elif dinov3:
            moved = _dinov3_key(key, value, qkv_bias)
            if len(moved) != 1:
                out.update(moved)
                continue
            ((key, value),) = moved.items()
        elif mim and key in (*_MIM_ONLY, "norm.weight", "norm.bias"):
            if key in _MIM_ONLY:
                continue
            key = key.replace("norm", "fc_norm")  # the pre-training norm starts fine-tuning's
        for old, new in _EVA_SWAPS:
            key = key.replace(old, new)
        if no_qkv:
            key = key.replace("q_bias", "q_proj.bias").replace("v_bias", "v_proj.bias")
        out[key] = value
    return out
