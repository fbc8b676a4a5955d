"""A ViT's attention, read as maps over its patches: the rollout, the class-specific
relevance and the last block's class-token attention.

Attention rollout is Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020):
each layer's attention, fused over heads, plus the identity (the residual path), rows
renormalised, multiplied through the layers; the class token's row says how much each patch
fed it. The discard ratio is that of jacobgil's vit-explain: the lowest fraction of each fused
map is zeroed first (never the class token's attention to itself). The last-layer class-token
attention is the map of Dosovitskiy et al. (2021), Figure 6.

The class-specific map is Chefer, Gur & Wolf, "Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021), as in "Transformer
Interpretability Beyond Attention Visualization" (CVPR 2021): with A a block's attention and
grad_A the gradient of the chosen class logit with respect to it, R = I and, block by block,
R += mean_heads(clamp(grad_A * A, min=0)) @ R.

All maps come from `model(x, return_attention=True)` -> (logits, [(B, heads, N, N)] per
block).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

HEAD_FUSIONS = ("mean", "max", "min")
READOUTS = ("class", "mean")


def _fuse_heads(attention: Tensor, head_fusion: str) -> Tensor:
    """(B, heads, N, N) -> (B, N, N)."""
    if head_fusion == "mean":
        return attention.mean(1)
    if head_fusion == "max":
        return attention.amax(1)
    if head_fusion == "min":
        return attention.amin(1)
    raise ValueError(f"unknown head_fusion {head_fusion!r}; expected mean, max or min")


def _read_out(
    relevance: Tensor, num_prefix_tokens: int, grid: tuple[int, int], readout: str
) -> Tensor:
    """The rows the head reads, over the patches: (B, N, N) -> (B, gh, gw). 'class': the class
    token's row; 'mean': the mean of the patch tokens' rows (average pooling)."""
    if readout == "class":
        row = relevance[:, 0, num_prefix_tokens:]  # (B, gh * gw)
    elif readout == "mean":
        row = relevance[:, num_prefix_tokens:, num_prefix_tokens:].mean(1)  # (B, gh * gw)
    else:
        raise ValueError(f"unknown readout {readout!r}; expected class or mean")
    return row.reshape(-1, *grid)  # (B, gh, gw)


def attention_rollout(
    attentions: Sequence[Tensor],
    *,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    readout: str = "class",
) -> Tensor:
    """Rollout from the class token to each patch: (B, gh, gw), summing to at most 1.

    Args:
        attentions: one (B, heads, N, N) tensor per block, in order.
        num_prefix_tokens: class (and distillation) tokens before the patches.
        grid: the patch grid (gh, gw), gh * gw = N - num_prefix_tokens.
        head_fusion: 'mean', 'max' or 'min' over heads.
        discard_ratio: fraction of each image's fused (N, N) map set to zero, lowest values
            first, before the identity is added; the class token's self-attention is kept.
        readout: 'class' (the class token's row) or 'mean' (the patch rows' mean).
    """
    if not attentions:
        raise ValueError("attention rollout needs at least one attention map")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    first = attentions[0]
    tokens = first.shape[-1]
    eye = torch.eye(tokens, dtype=torch.float32, device=first.device)
    rollout = eye.expand(first.shape[0], tokens, tokens)  # (B, N, N)
    for attention in attentions:
        fused = _fuse_heads(attention.float(), head_fusion)  # (B, N, N)
        discard = int(tokens * tokens * discard_ratio)
        if discard:
            flat = fused.flatten(1).clone()  # (B, N * N)
            lowest = flat.topk(discard, dim=-1, largest=False).indices  # (B, discard)
            kept = flat[:, 0].clone()  # the class token's attention to itself
            flat.scatter_(1, lowest, 0.0)
            flat[:, 0] = kept
            fused = flat.reshape_as(fused)  # (B, N, N)
        fused = 0.5 * fused + 0.5 * eye
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused @ rollout  # (B, N, N)
    return _read_out(rollout, num_prefix_tokens, grid, readout)


def gradient_relevance(
    attentions: Sequence[Tensor],
    gradients: Sequence[Tensor],
    *,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    readout: str = "class",
) -> Tensor:
    """Class-specific relevance of each patch (Chefer et al. 2021): (B, gh, gw), >= 0.

    Args:
        attentions: one (B, heads, N, N) tensor per block, in order.
        gradients: the gradient of the explained logit with respect to each of them.
        num_prefix_tokens: class (and distillation) tokens before the patches.
        grid: the patch grid (gh, gw).
        readout: 'class' (the class token's row) or 'mean' (the patch rows' mean).
    """
    if not attentions or len(attentions) != len(gradients):
        raise ValueError("gradient_relevance needs one gradient per attention map (at least one)")
    first = attentions[0]
    tokens = first.shape[-1]
    relevance = torch.eye(tokens, dtype=torch.float32, device=first.device)
    relevance = relevance.repeat(first.shape[0], 1, 1)  # (B, N, N)
    for attention, grad in zip(attentions, gradients):
        cam = (grad.float() * attention.float()).clamp(min=0).mean(1)  # (B, N, N)
        relevance = relevance + cam @ relevance  # (B, N, N)
    return _read_out(relevance, num_prefix_tokens, grid, readout)


def cls_attention(attention: Tensor, *, num_prefix_tokens: int, grid: tuple[int, int]) -> Tensor:
    """The class token's attention to each patch in one block, per head: (B, heads, gh, gw)."""
    row = attention[:, :, 0, num_prefix_tokens:].float()  # (B, heads, gh * gw)
    return row.reshape(*row.shape[:2], *grid)  # (B, heads, gh, gw)


def attention_maps(
    model: nn.Module,
    images: Tensor,
    head_fusion: str = "mean",
    *,
    discard_ratio: float = 0.0,
    target: int | Sequence[int] | Tensor | None = None,
) -> dict[str, Tensor]:
    """Logits and maps for a batch of normalised images (B, C, H, W), in eval mode (the
    model's training flag is restored).

    Returns `logits` (B, K); `target` (B,), the explained class (given, else predicted);
    `relevance` (B, gh, gw), its class-specific map; `rollout` (B, gh, gw); `cls_attention`
    (B, gh, gw, head mean of the last block) and `cls_attention_heads` (B, heads, gh, gw).
    Only a model that pools its class token (global_pool='token') is read at the class
    token's row; the others ('avg', 'max', 'avgmax', the 'map' attention pool, 'none') have
    no such row to read, so every map reads the patch rows' mean (`readout_of`).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            # The input joins the graph so that frozen weights still give gradients.
            logits, attentions = model(images.detach().requires_grad_(True), return_attention=True)
            chosen = explained_classes(target, logits)
            score = logits.gather(1, chosen[:, None]).sum()
            gradients = torch.autograd.grad(score, attentions)
    finally:
        model.train(was_training)
    attentions = [a.detach() for a in attentions]
    grid = model.patch_embed.grid_for(*images.shape[-2:])
    prefix = model.num_prefix_tokens
    readout = readout_of(model)
    if readout == "class":
        heads = cls_attention(attentions[-1], num_prefix_tokens=prefix, grid=grid)
    else:  # no class-token row to read: the patch rows' mean, per head
        last = attentions[-1][:, :, prefix:, prefix:].float().mean(2)  # (B, heads, gh * gw)
        heads = last.reshape(*last.shape[:2], *grid)  # (B, heads, gh, gw)
    common = {"num_prefix_tokens": prefix, "grid": grid, "readout": readout}
    return {
        "logits": logits.detach(),
        "target": chosen,
        "relevance": gradient_relevance(attentions, gradients, **common),
        "rollout": attention_rollout(
            attentions, head_fusion=head_fusion, discard_ratio=discard_ratio, **common
        ),
        "cls_attention": heads.mean(1),
        "cls_attention_heads": heads,
    }


def readout_of(model: nn.Module) -> str:
    """'class' for a model whose head reads its class token, else 'mean' (the patch tokens'
    rows): max, avgmax and attention pooling have no one row to follow, so their maps show
    where the patch tokens look on average."""
    return "class" if getattr(model, "global_pool", "token") == "token" else "mean"


def explained_classes(target: int | Sequence[int] | Tensor | None, logits: Tensor) -> Tensor:
    """The class to explain per image, (B,): the given one(s), else the predicted."""
    batch, classes = logits.shape
    if target is None:
        return logits.detach().argmax(dim=-1)
    chosen = torch.as_tensor(target, device=logits.device).long().reshape(-1).expand(batch)
    bad = chosen[(chosen < 0) | (chosen >= classes)]
    if bad.numel():
        raise ValueError(
            f"class {int(bad[0])} is out of range for a model with {classes} classes; "
            f"choose 0 to {classes - 1}"
        )
    return chosen.clone()


def class_index(text: str, names: Sequence[str], *, given_as: str = "--class") -> int:
    """The class `text` names: a class name of the model, else an index (errors name it as
    `given_as`, the flag or parameter it came from)."""
    if text in names:
        return list(names).index(text)
    if text.isdigit() and int(text) < len(names):
        return int(text)
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    raise ValueError(
        f"{given_as} {text!r} is not a class of this checkpoint; give a name ({shown}) or an "
        f"index 0 to {len(names) - 1}"
    )
