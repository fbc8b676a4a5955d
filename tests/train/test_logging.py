"""Where training shows up: metrics.csv beside metrics.jsonl, TensorBoard scalars, the final
summary of `run_training`, and per-class scores of `evaluate`."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch

from _helpers import FixedLogits, digits_subsets
from vitkit import create_model
from vitkit.data import TensorImages
from vitkit.train import TrainConfig, evaluate, fit, make_loader, run_training
from vitkit.train.logs import LoggerUnavailableError
from vitkit.train.tasks import ClassificationTask


def tiny_model():
    torch.manual_seed(0)
    return create_model("vit_digits", embed_dim=16, depth=1, num_heads=2)


@pytest.fixture(scope="module")
def digits():
    return digits_subsets(96, 32)


def cfg(**kw):
    base = dict(epochs=2, batch_size=32, lr=2e-3, warmup_epochs=0, mixup=0.0, cutmix=0.0)
    return TrainConfig(**{**base, **kw})


def test_metrics_csv_holds_the_rows_of_metrics_jsonl(tmp_path, digits):
    fit(ClassificationTask(tiny_model(), cfg(ema=0.9)), *digits, cfg(ema=0.9), out_dir=tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    with open(tmp_path / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(rows[0])  # the same columns, in the same order
    assert "ema_val_acc1" in table[0] and len(table) == 2
    assert [{k: float(v) for k, v in line.items()} for line in table] == rows


def test_tensorboard_gets_every_metric_of_every_epoch(tmp_path, digits):
    pytest.importorskip("tensorboard", reason="the optional tensorboard package is absent")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = fit(
        ClassificationTask(tiny_model(), cfg()),
        *digits,
        cfg(),
        out_dir=tmp_path,
        loggers=("tensorboard",),
    )
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted(k for k in result.history[0] if k != "epoch")
    for tag in tags:
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        expected = [(row["epoch"], row[tag]) for row in result.history]
        assert [s for s, _ in logged] == [s for s, _ in expected]
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_tensorboard_missing_is_one_line_before_anything_runs(tmp_path, digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard fails
    with pytest.raises(LoggerUnavailableError) as err:
        fit(
            ClassificationTask(tiny_model(), cfg()),
            *digits,
            cfg(),
            out_dir=tmp_path / "run",
            loggers=("tensorboard",),
        )
    assert str(err.value) == (
        "logging to tensorboard needs the tensorboard package, which is not installed: pip "
        "install tensorboard (or pip install 'vitkit[tensorboard]')"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="unknown logger 'wandb'; expected one of tensorboard"):
        fit(ClassificationTask(tiny_model(), cfg()), *digits, cfg(), loggers=("wandb",))


def test_run_training_returns_a_machine_readable_summary(tmp_path):
    config = TrainConfig(model="vit_digits", model_opts={"embed_dim": 16, "depth": 1,
                         "num_heads": 2}, epochs=2, batch_size=64, lr=5e-3, warmup_epochs=0,
                         mixup=0.0, cutmix=0.0, threads=1)  # fmt: skip
    outcome = run_training(config, tmp_path / "run")
    summary = json.loads(json.dumps(outcome.summary(), allow_nan=False))
    history = outcome.result.history
    best = max(range(2), key=lambda i: (history[i]["val_acc1"], i))
    assert summary == {
        "task": "classification",
        "out": str(tmp_path / "run"),
        "interrupted": False,
        "epochs": 2,
        "best": {"metric": "val_acc1", "value": history[best]["val_acc1"], "epoch": best + 1},
        "last": history[-1],
        "test": {k: outcome.test[k] for k in ("loss", "acc1", "acc5", "count")},
        "skipped_images": 0,
        "files": sorted(["config.json", "curves.png", "last.safetensors", "metrics.csv",
                         "metrics.jsonl", "model.safetensors", "state.pt", "test.json"]),
    }  # fmt: skip
    assert summary["test"]["count"] == 359


def test_per_class_scores_match_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is the reference")
    generator = torch.Generator().manual_seed(3)
    table = torch.randn(40, 5, generator=generator)
    table[:, 4] -= 10  # class 4 is never predicted: its precision has nothing to divide by
    labels = torch.randint(0, 4, (40,), generator=generator)  # class 4 never occurs either
    images = torch.arange(40.0).view(40, 1, 1, 1).expand(40, 1, 2, 2).contiguous()
    loader = make_loader(TensorImages(images, labels), 16, train=False)
    scores = evaluate(FixedLogits(table), loader, num_classes=5)["per_class"]
    expected = metrics.precision_recall_fscore_support(
        labels.numpy(), table.argmax(-1).numpy(), labels=range(5), zero_division=0
    )
    for name, reference in zip(("precision", "recall", "f1", "support"), expected):
        assert scores[name] == pytest.approx(reference.tolist(), abs=1e-12), name
    assert scores["precision"][4] == scores["recall"][4] == scores["f1"][4] == 0.0
