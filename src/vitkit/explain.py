"""What the model looks at, and how training went: attention maps and the run's pictures.

Attention rollout is Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020):
each layer's head-averaged attention plus the identity (the residual path), rows renormalised,
multiplied through the layers; the class token's row says how much each patch fed it. The
last-layer class-token attention is the map of Dosovitskiy et al. (2021), Figure 6.

All maps come from `model(x, return_attention=True)` -> (logits, [(B, heads, N, N)] per
block). Drawing uses matplotlib's Agg backend and writes PNG files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .files import atomic_write


def attention_rollout(
    attentions: Sequence[Tensor],
    *,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head_fusion: str = "mean",
) -> Tensor:
    """Rollout from the class token to each patch: (B, gh, gw), summing to at most 1.

    Args:
        attentions: one (B, heads, N, N) tensor per block, in order.
        num_prefix_tokens: class (and distillation) tokens before the patches.
        grid: the patch grid (gh, gw), gh * gw = N - num_prefix_tokens.
        head_fusion: 'mean', 'max' or 'min' over heads.
    """
    if not attentions:
        raise ValueError("attention rollout needs at least one attention map")
    fuse = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}
    if head_fusion not in fuse:
        raise ValueError(f"unknown head_fusion {head_fusion!r}; expected mean, max or min")
    first = attentions[0]
    tokens = first.shape[-1]
    eye = torch.eye(tokens, dtype=torch.float32, device=first.device)
    rollout = eye.expand(first.shape[0], tokens, tokens)  # (B, N, N)
    for attention in attentions:
        fused = fuse[head_fusion](attention.float())  # (B, N, N)
        fused = 0.5 * fused + 0.5 * eye
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused @ rollout  # (B, N, N)
    cls_row = rollout[:, 0, num_prefix_tokens:]  # (B, gh * gw)
    return cls_row.reshape(-1, *grid)  # (B, gh, gw)


def cls_attention(attention: Tensor, *, num_prefix_tokens: int, grid: tuple[int, int]) -> Tensor:
    """The class token's attention to each patch in one block, per head: (B, heads, gh, gw)."""
    row = attention[:, :, 0, num_prefix_tokens:].float()  # (B, heads, gh * gw)
    return row.reshape(*row.shape[:2], *grid)  # (B, heads, gh, gw)


@torch.no_grad()
def attention_maps(
    model: nn.Module, images: Tensor, head_fusion: str = "mean"
) -> dict[str, Tensor]:
    """Logits and maps for a batch of normalised images (B, C, H, W).

    Returns `logits` (B, K), `rollout` (B, gh, gw), `cls_attention` (B, gh, gw, head mean of
    the last block) and `cls_attention_heads` (B, heads, gh, gw).
    """
    model.eval()
    logits, attentions = model(images, return_attention=True)
    grid = model.patch_embed.grid_for(*images.shape[-2:])
    prefix = model.num_prefix_tokens
    heads = cls_attention(attentions[-1], num_prefix_tokens=prefix, grid=grid)
    return {
        "logits": logits,
        "rollout": attention_rollout(
            attentions, num_prefix_tokens=prefix, grid=grid, head_fusion=head_fusion
        ),
        "cls_attention": heads.mean(1),
        "cls_attention_heads": heads,
    }


# -- drawing --------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig: Any, path: str | os.PathLike) -> None:
    plt = _pyplot()
    path = Path(path)
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _show_image(ax: Any, image: Tensor) -> None:
    array = image.detach().cpu().clamp(0, 1)
    if array.shape[0] == 1:
        ax.imshow(array[0].numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(array.permute(1, 2, 0).numpy())  # (H, W, C)
    ax.set_axis_off()


def _overlay(ax: Any, image: Tensor, heat: Tensor, title: str) -> None:
    _show_image(ax, image)
    size = image.shape[-2:]
    heat = heat.float()
    heat = (heat - heat.min()) / (heat.max() - heat.min()).clamp_min(1e-12)
    up = F.interpolate(heat[None, None], size=size, mode="bilinear", align_corners=False)
    ax.imshow(up[0, 0].cpu().numpy(), cmap="jet", alpha=0.5, vmin=0, vmax=1)
    ax.set_title(title, fontsize=9)


def draw_explanation(
    image: Tensor,
    maps: dict[str, Tensor],
    path: str | os.PathLike,
    *,
    title: str = "",
    per_head: bool = False,
) -> None:
    """PNG: the image, the rollout over it, the last-layer class attention over it and, with
    `per_head`, one panel per head. `image` is (C, H, W) in [0, 1]; maps are one image's."""
    plt = _pyplot()
    panels = [("image", None), ("attention rollout", maps["rollout"])]
    panels.append(("last-layer [CLS] attention", maps["cls_attention"]))
    if per_head:
        for h, heat in enumerate(maps["cls_attention_heads"]):
            panels.append((f"head {h}", heat))
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows + 0.4), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    for ax, (name, heat) in zip(axes.flat, panels):
        if heat is None:
            _show_image(ax, image)
            ax.set_title(name, fontsize=9)
        else:
            _overlay(ax, image, heat, name)
    if title:
        fig.suptitle(title, fontsize=11)
    _save_figure(fig, path)


def plot_curves(history: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """PNG with two panels: train/val loss and val top-1 (and top-5) accuracy per epoch."""
    plt = _pyplot()
    epochs = [row["epoch"] for row in history]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    loss_ax.plot(epochs, [r["train_loss"] for r in history], label="train (mixed targets)")
    loss_ax.plot(epochs, [r["val_loss"] for r in history], label="val")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy")
    loss_ax.set_title("loss")
    loss_ax.legend()
    acc_ax.plot(epochs, [r["val_acc1"] for r in history], label="val top-1")
    acc_ax.plot(epochs, [r["val_acc5"] for r in history], label="val top-5")
    if "ema_val_acc1" in history[0]:
        acc_ax.plot(epochs, [r["ema_val_acc1"] for r in history], label="EMA val top-1")
    acc_ax.set_xlabel("epoch")
    acc_ax.set_ylabel("accuracy")
    acc_ax.set_ylim(0, 1.02)
    acc_ax.set_title("accuracy")
    acc_ax.legend(loc="lower right")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    _save_figure(fig, path)


def plot_confusion(
    confusion: Tensor, class_names: Sequence[str], path: str | os.PathLike, title: str = ""
) -> None:
    """PNG of a confusion matrix (rows true, columns predicted), counts written in the cells
    when there are at most 20 classes."""
    plt = _pyplot()
    k = len(class_names)
    matrix = confusion.cpu().numpy()
    size = max(4.0, min(0.5 * k + 2, 20.0))
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    if k <= 20:
        ticks = list(range(k))
        ax.set_xticks(ticks, class_names, rotation=90 if k > 10 else 0)
        ax.set_yticks(ticks, class_names)
        limit = matrix.max() / 2 if matrix.size else 0
        for i in range(k):
            for j in range(k):
                ax.text(
                    j,
                    i,
                    str(int(matrix[i, j])),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if matrix[i, j] > limit else "black",
                )
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if title:
        ax.set_title(title)
    _save_figure(fig, path)
