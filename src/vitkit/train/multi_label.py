"""Multi-label scores: each class's average precision (its mean over the classes is the mAP of
Pascal VOC / COCO classification, as scikit-learn's `average_precision_score(average='macro')`
gives it), and precision, recall and F1 of the labels over a threshold.

The model gives one sigmoid score per class (one-vs-rest). Average precision ranks the
images by a class's score: AP = sum over the distinct scores s of (R(s) - R(s')) * P(s), the
precision at each threshold weighted by the recall it adds (tied scores are one threshold);
a class without positive images scores 0, as scikit-learn's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .distributed import world
from .loop import autocast
from .losses import binary_cross_entropy
from .sharded import lockstep

THRESHOLD = 0.5  # a label is predicted when its sigmoid reaches it (`--threshold`)


def average_precision(scores: Tensor, targets: Tensor) -> Tensor:
    """Each class's average precision (K,) of scores and 0/1 targets, both (N, K)."""
    return torch.stack([_class_ap(scores[:, k], targets[:, k]) for k in range(scores.shape[1])])


def _class_ap(scores: Tensor, positive: Tensor) -> Tensor:
    """One class's AP: precision at each distinct score, weighted by the recall it adds."""
    scores, positive = scores.double(), (positive > 0.5).double()
    total = positive.sum()
    if total == 0:
        return torch.zeros((), dtype=torch.float64)
    order = torch.argsort(scores, descending=True, stable=True)
    ranked, hits = scores[order], positive[order]
    true_pos = hits.cumsum(0)
    last = torch.ones_like(ranked, dtype=torch.bool)  # the last image of each tied score
    last[:-1] = ranked[1:] != ranked[:-1]
    true_pos = true_pos[last]
    seen = torch.arange(1, len(ranked) + 1, dtype=torch.float64)[last]
    precision, recall = true_pos / seen, true_pos / total
    gained = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
    return (gained * precision).sum()


def threshold_scores(probs: Tensor, targets: Tensor, threshold: float) -> dict[str, Any]:
    """Precision, recall and F1 of the labels at or over `threshold`: per class, and their
    micro averages (every image's every label counted once: `f1`)."""
    predicted, actual = probs >= threshold, targets > 0.5
    hits = (predicted & actual).sum(0).double()
    said, true = predicted.sum(0).double(), actual.sum(0).double()
    precision = torch.where(said > 0, hits / said.clamp(min=1), 0.0)
    recall = torch.where(true > 0, hits / true.clamp(min=1), 0.0)
    both = precision + recall
    f1 = torch.where(both > 0, 2 * precision * recall / both.clamp(min=1e-300), 0.0)
    micro_p = hits.sum() / said.sum() if said.sum() > 0 else torch.tensor(0.0)
    micro_r = hits.sum() / true.sum() if true.sum() > 0 else torch.tensor(0.0)
    micro = 2 * micro_p * micro_r / (micro_p + micro_r) if micro_p + micro_r > 0 else 0.0
    return {
        "precision": precision.tolist(),
        "recall": recall.tolist(),
        "f1": f1.tolist(),
        "support": true.long().tolist(),
        "micro_precision": float(micro_p),
        "micro_recall": float(micro_r),
        "micro_f1": float(micro),
    }


@torch.no_grad()
def evaluate_multi_label(
    model: nn.Module,
    loader: Iterable,
    *,
    device: torch.device | str = "cpu",
    amp: str = "none",
    threshold: float = THRESHOLD,
) -> dict[str, Any]:
    """Mean binary cross-entropy, mAP, each class's AP and the F1 at `threshold` (`f1`: over
    every label of every image; `macro_f1`: the mean of the classes') of a multi-label
    classifier over `loader` (targets multi-hot, or class indices made one-hot);
    every rank's scores are gathered first."""
    device = torch.device(device)
    model.eval()
    all_logits, all_targets = [], []
    for (images, labels), counted in lockstep(loader, model):
        if len(labels) == 0:
            continue
        with autocast(amp, device):
            logits = model(images.to(device))
        if not counted:
            continue
        all_logits.append(logits.float().cpu())
        all_targets.append(dense_targets(labels, logits.shape[-1]).cpu())
    logits, targets = _gathered(all_logits, all_targets)
    if len(logits) == 0:
        raise ValueError("nothing to evaluate: the evaluation data is empty")
    probs = torch.sigmoid(logits)
    ap = average_precision(probs, targets)
    scores = threshold_scores(probs, targets, threshold)
    return {
        "loss": binary_cross_entropy(logits, targets).item(),
        "map": ap.mean().item(),
        "ap": ap.tolist(),
        "f1": scores["micro_f1"],
        "macro_f1": sum(scores["f1"]) / len(scores["f1"]),
        "threshold": threshold,
        "count": len(logits),
        "per_class": {key: scores[key] for key in ("precision", "recall", "f1", "support")},
        "micro": {key: scores[f"micro_{key}"] for key in ("precision", "recall", "f1")},
    }


def dense_targets(labels: Tensor, num_classes: int) -> Tensor:
    """(B, K) 0/1 targets: multi-hot labels as they are, class indices one-hot."""
    if labels.dim() == 2:
        return labels.float()
    return torch.nn.functional.one_hot(labels.long(), num_classes).float()


def _gathered(logits: list[Tensor], targets: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The (N, K) logits and targets of every rank, concatenated."""
    mine = (torch.cat(logits), torch.cat(targets)) if logits else (torch.empty(0), torch.empty(0))
    if world()[1] == 1:
        return mine
    parts: list[Any] = [None] * world()[1]
    dist.all_gather_object(parts, mine)
    kept = [part for part in parts if len(part[0])]
    if not kept:
        return mine
    return torch.cat([p[0] for p in kept]), torch.cat([p[1] for p in kept])
