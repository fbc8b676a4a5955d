"""The pictures of a run and of an evaluation: training curves, confusion matrix, per-class
scores, MAE reconstructions. matplotlib's Agg backend, PNG files written atomically."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .files import atomic_write
from .model.layers.patch_embed import patchify, unpatchify


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike) -> None:
    """Write `fig` as a PNG atomically, then close it."""
    plt = pyplot()
    path = Path(path)
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100, bbox_inches="tight"))
    finally:
        plt.close(fig)


def figure_png(fig: Any) -> bytes:
    """`fig` as PNG bytes (for an answer, not a file), then closed."""
    plt = pyplot()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()


MARKED_EPOCHS = 30  # runs up to this long get a marker per epoch


def plot_curves(history: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """PNG of the run per epoch: train / val loss and, for a classifier, a second panel with
    val top-1 (and top-5, and the EMA's top-1)."""
    plt = pyplot()
    epochs = [row["epoch"] for row in history]
    accuracy = "val_acc1" in history[0]
    fig, axes = plt.subplots(
        1, 2 if accuracy else 1, figsize=(10 if accuracy else 5, 4), squeeze=False
    )
    # Points are marked on short runs: a single epoch is a point, which a line alone does not draw.
    style = {"marker": "o", "markersize": 4} if len(epochs) <= MARKED_EPOCHS else {}
    loss_ax = axes[0, 0]
    train_label = "train (mixed targets)" if accuracy else "train"
    loss_ax.plot(epochs, [r["train_loss"] for r in history], label=train_label, **style)
    loss_ax.plot(epochs, [r["val_loss"] for r in history], label="val", **style)
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy" if accuracy else "loss")
    loss_ax.set_title("loss")
    loss_ax.legend()
    if accuracy:
        acc_ax = axes[0, 1]
        acc_ax.plot(epochs, [r["val_acc1"] for r in history], label="val top-1", **style)
        acc_ax.plot(epochs, [r["val_acc5"] for r in history], label="val top-5", **style)
        if "ema_val_acc1" in history[0]:
            ema = [r["ema_val_acc1"] for r in history]
            acc_ax.plot(epochs, ema, label="EMA val top-1", **style)
        acc_ax.set_xlabel("epoch")
        acc_ax.set_ylabel("accuracy")
        acc_ax.set_ylim(0, 1.02)
        acc_ax.set_title("accuracy")
        acc_ax.legend(loc="lower right")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_confusion(
    confusion: Tensor, class_names: Sequence[str], path: str | os.PathLike, title: str = ""
) -> None:
    """PNG of a confusion matrix (rows true, columns predicted), counts written in the cells
    when there are at most 20 classes."""
    plt = pyplot()
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
    save_figure(fig, path)


def plot_per_class(
    scores: dict[str, Sequence[float]],
    class_names: Sequence[str],
    path: str | os.PathLike,
    title: str = "",
) -> None:
    """PNG of each class's precision, recall and F1 (`evaluate(...)["per_class"]`): one row of
    three bars per class, its support beside its name."""
    plt = pyplot()
    k = len(class_names)
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.35 * k * 1.5 + 1)))
    height = 0.27
    rows = list(range(k))
    for offset, (name, colour) in enumerate(
        (("precision", "tab:blue"), ("recall", "tab:orange"), ("f1", "tab:green"))
    ):
        ax.barh(
            [r + (offset - 1) * height for r in rows],
            scores[name],
            height=height,
            label=name if name != "f1" else "F1",
            color=colour,
        )
    support = scores.get("support")
    labels = [f"{n} ({support[i]})" if support else str(n) for i, n in enumerate(class_names)]
    ax.set_yticks(rows, labels, fontsize=8)
    ax.invert_yaxis()  # the first class on top
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("score (support in brackets)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    save_figure(fig, path)


@torch.no_grad()
def draw_reconstructions(
    mae: nn.Module,
    images: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    path: str | os.PathLike,
) -> None:
    """A PNG: per image, the original, the visible patches, and the reconstruction (its
    visible patches pasted back, as the MAE paper's figures show)."""
    plt = pyplot()
    mae.eval()
    device = next(mae.parameters()).device
    same_masks = torch.Generator(device=device).manual_seed(0)
    _, pred, mask = mae(images.to(device), generator=same_masks)
    images, pred, mask = images.cpu(), pred.float().cpu(), mask.cpu()
    patches = patchify(images, mae.patch_size)  # (B, N, pixels)
    if mae.norm_pix_loss:  # back to pixels with each patch's own statistics
        std_per_patch = (patches.var(-1, keepdim=True) + 1e-6) ** 0.5
        pred = pred * std_per_patch + patches.mean(-1, keepdim=True)
    keep = (1 - mask)[..., None]  # (B, N, 1): 1 at visible patches
    seen = unpatchify(patches * keep, mae.patch_size, mae.grid)
    rebuilt = unpatchify(patches * keep + pred * (1 - keep), mae.patch_size, mae.grid)
    to_pixels = _denormalise(mean, std)
    rows = len(images)
    figure, axes = plt.subplots(rows, 3, figsize=(6, 2 * rows), squeeze=False)
    columns = (("original", images), ("visible", seen), ("reconstruction", rebuilt))
    for i in range(rows):
        for j, (title, pictures) in enumerate(columns):
            grey = pictures.shape[1] == 1
            axes[i, j].imshow(to_pixels(pictures[i]), cmap="gray" if grey else None)
            axes[i, j].set_axis_off()
            if i == 0:
                axes[i, j].set_title(title, fontsize=9)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    plt.close(figure)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))


def _denormalise(mean: Sequence[float], std: Sequence[float]) -> Callable[[Tensor], Any]:
    mean_t = torch.tensor(mean).view(-1, 1, 1)
    std_t = torch.tensor(std).view(-1, 1, 1)

    def convert(picture: Tensor) -> Any:
        pixels = (picture * std_t + mean_t).clamp(0, 1)
        return pixels.permute(1, 2, 0).squeeze(-1).numpy()

    return convert
