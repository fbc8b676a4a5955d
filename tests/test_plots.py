"""The pictures of a run and of an evaluation (`vitkit.plots`)."""

from __future__ import annotations

import torch

from vitkit.plots import plot_confusion, plot_curves

PNG = b"\x89PNG\r\n\x1a\n"


def test_curves_and_confusion_pictures(tmp_path):
    history = [
        {
            "epoch": e,
            "train_loss": 1 / e,
            "val_loss": 1.2 / e,
            "val_acc1": 0.5 + e / 10,
            "val_acc5": 0.9,
        }
        for e in (1, 2, 3)
    ]
    plot_curves(history, tmp_path / "curves.png")
    plot_confusion(torch.tensor([[3, 1], [0, 4]]), ["cat", "dog"], tmp_path / "cm.png")
    for name in ("curves.png", "cm.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and len(data) > 2000


def test_per_class_picture(tmp_path):
    from vitkit.plots import plot_per_class

    scores = {"precision": [1.0, 0.5, 0.0], "recall": [0.75, 1.0, 0.0], "f1": [0.857, 0.667, 0.0],
              "support": [4, 2, 0]}  # fmt: skip
    plot_per_class(scores, ["cat", "dog", "eel"], tmp_path / "per_class.png", title="test")
    data = (tmp_path / "per_class.png").read_bytes()
    assert data[:8] == PNG and len(data) > 2000


def test_a_one_epoch_run_draws_its_points(tmp_path, monkeypatch):
    """A single epoch is one point per curve: a line alone draws nothing, so every curve of a
    short run is marked (curves.png was blank after `--epochs 1`)."""
    from vitkit import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    row = {"epoch": 1, "train_loss": 1.0, "val_loss": 1.2, "val_acc1": 0.5, "val_acc5": 0.9}
    plot_curves([{**row, "ema_val_acc1": 0.6}], tmp_path / "curves.png")
    lines = [line for ax in drawn[0].axes for line in ax.get_lines()]
    assert len(lines) == 5
    assert all(len(line.get_xdata()) == 1 and line.get_marker() == "o" for line in lines)
    long = [{**row, "epoch": e} for e in range(1, 32)]
    plot_curves(long, tmp_path / "curves.png")
    assert {line.get_marker() for ax in drawn[1].axes for line in ax.get_lines()} == {"None"}
