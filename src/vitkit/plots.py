"""The pictures of a run and of an evaluation: training curves, confusion matrix, per-class
scores, MAE reconstructions. matplotlib's Agg backend, PNG files written atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from .files import atomic_write


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


def plot_curves(history: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """PNG with two panels: train/val loss and val top-1 (and top-5) accuracy per epoch."""
    plt = pyplot()
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
