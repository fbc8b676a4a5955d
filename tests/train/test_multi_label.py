"""Multi-label classification: the one-vs-rest losses equal timm's (ASL, BCE with smoothing),
Mixup mixes multi-hot targets as timm's, the scores equal scikit-learn's (average precision,
F1 at a threshold), and a file list with several labels per image trains to a checkpoint that
records it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from _helpers import colour_list
from vitkit.data import Mixup
from vitkit.data.augment import binary_targets
from vitkit.train import ClassificationTask, average_precision, resolve_config, run_job
from vitkit.train.losses import asymmetric_loss, binary_cross_entropy
from vitkit.train.multi_label import threshold_scores

timm = pytest.importorskip("timm")


def _batch(seed: int = 0, n: int = 16, k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=generator) * 3
    targets = (torch.rand(n, k, generator=generator) < 0.4).float()
    return logits, targets


@pytest.mark.parametrize("soft", [False, True])
def test_asl_equals_timms(soft):
    from timm.loss import AsymmetricLossMultiLabel

    logits, targets = _batch()
    if soft:  # mixed, smoothed targets
        targets = (
            binary_targets(targets, 5, 0.1) * 0.7 + binary_targets(targets.flip(0), 5, 0.1) * 0.3
        )
    ours = asymmetric_loss(logits, targets)
    theirs = AsymmetricLossMultiLabel()(logits, targets)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bce_of_smoothed_targets_equals_timms_binary_cross_entropy(smoothing):
    from timm.loss import BinaryCrossEntropy

    logits, targets = _batch(1)
    ours = binary_cross_entropy(logits, binary_targets(targets, 5, smoothing))
    theirs = BinaryCrossEntropy(smoothing=smoothing, smooth_dense=True)(logits, targets)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    # class indices (a single-label list trained with --multi-label): timm one-hot encodes them
    labels = targets.argmax(-1)
    torch.testing.assert_close(
        binary_cross_entropy(logits, binary_targets(labels, 5)),
        BinaryCrossEntropy(smoothing=0.0)(logits, labels), rtol=1e-6, atol=1e-7,
    )  # fmt: skip


@pytest.mark.parametrize("cutmix", [False, True])
def test_mixup_mixes_multi_hot_targets_as_timm(cutmix):
    from timm.data.mixup import mixup_target

    _, targets = _batch(2, n=6)
    # image 0 all zeros, image 5 (its flip) all ones: the mixed image 0 tells lam
    images = torch.zeros(6, 1, 8, 8)
    images[5] = 1.0
    mix = Mixup(mixup_alpha=0.0 if cutmix else 0.8, cutmix_alpha=1.0 if cutmix else 0.0,
                label_smoothing=0.1, num_classes=5, multi_label=True)  # fmt: skip
    torch.manual_seed(3)
    mixed, ours = mix(images, targets)
    lam = 1.0 - mixed[0].mean().item()
    assert 0.0 < lam < 1.0
    theirs = mixup_target(targets, 5, lam, smoothing=0.1, multi_label=True)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_average_precision_equals_sklearns_with_ties_and_a_class_without_positives():
    from sklearn.metrics import average_precision_score

    logits, targets = _batch(4, n=40, k=6)
    scores = (torch.sigmoid(logits) * 10).round() / 10  # many ties
    targets[:, 5] = 0  # no positive image: AP 0, as scikit-learn's
    ours = average_precision(scores, targets)
    with pytest.warns(UserWarning, match="No positive class"):
        per_class = average_precision_score(targets.numpy(), scores.numpy(), average=None)
        macro = average_precision_score(targets.numpy(), scores.numpy(), average="macro")
    np.testing.assert_allclose(ours.numpy(), per_class, rtol=0, atol=1e-12)
    assert ours.mean().item() == pytest.approx(macro, abs=1e-12)


def test_threshold_scores_equal_sklearns_f1():
    from sklearn.metrics import f1_score, precision_score, recall_score

    logits, targets = _batch(5, n=30, k=4)
    probs = torch.sigmoid(logits)
    scores = threshold_scores(probs, targets, 0.6)
    predicted = (probs >= 0.6).numpy()
    np.testing.assert_allclose(
        scores["f1"], f1_score(targets, predicted, average=None, zero_division=0)
    )
    assert scores["micro_f1"] == pytest.approx(f1_score(targets, predicted, average="micro"))
    assert scores["micro_precision"] == pytest.approx(
        precision_score(targets, predicted, average="micro")
    )
    assert scores["micro_recall"] == pytest.approx(
        recall_score(targets, predicted, average="micro")
    )


OPTIONS = {"model": "vit_digits", "epochs": 2, "batch_size": 8, "lr": 5e-3,
           "model_opts": {"embed_dim": 16, "depth": 1, "num_heads": 2, "in_chans": 3}}  # fmt: skip


@pytest.mark.parametrize("loss", ["bce", "asl"])
def test_a_multi_label_list_trains_one_vs_rest_and_records_it(tmp_path, loss):
    data = colour_list(tmp_path / "data")
    config = resolve_config({**OPTIONS, "data": f"list:{data}", "multi_label_loss": loss,
                             "threshold": 0.4})  # fmt: skip
    outcome = run_job(ClassificationTask, config, tmp_path / "run")
    history = outcome.result.history
    assert outcome.result.best_metric == "val_map"
    assert all(0.0 <= row["val_map"] <= 1.0 and "val_acc1" not in row for row in history)
    test = json.loads((tmp_path / "run" / "test.json").read_text())
    assert test["test_map"] == pytest.approx(sum(test["test_ap"]) / 3)
    assert len(test["test_ap"]) == 3 and test["best_epoch"] in (1, 2)
    with safe_open(str(tmp_path / "run" / "model.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["vitkit_meta"])
    assert (meta["multi_label"], meta["threshold"], meta["class_names"]) == (
        True,
        0.4,
        ["blue", "green", "red"],
    )
    assert "val_map" in meta and "val_acc1" not in meta


def test_multi_label_refuses_a_teacher():
    from vitkit import create_model

    model = create_model("vit_digits", embed_dim=16, depth=1, num_heads=2, distilled=True)
    config = resolve_config({**OPTIONS, "distill": "hard", "teacher": "timm:resnet18"})
    with pytest.raises(ValueError, match="distillation trains a single-label student"):
        ClassificationTask(model, config, teacher=torch.nn.Identity(), multi_label=True)
