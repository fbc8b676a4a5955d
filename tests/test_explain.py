"""Attention rollout, class-token attention and the pictures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitkit import create_model
from vitkit.explain import (
    attention_maps,
    attention_rollout,
    cls_attention,
    draw_explanation,
    plot_confusion,
    plot_curves,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _random_attention(b, h, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h, n, n, generator=g), dim=-1)


def test_rollout_matches_a_numpy_reference():
    attentions = [_random_attention(2, 3, 5, s) for s in range(3)]  # 1 prefix + 2x2 patches
    out = attention_rollout(attentions, num_prefix_tokens=1, grid=(2, 2))
    for b in range(2):
        ref = np.eye(5)
        for a in attentions:
            fused = a[b].mean(0).double().numpy() * 0.5 + np.eye(5) * 0.5
            fused /= fused.sum(-1, keepdims=True)
            ref = fused @ ref
        np.testing.assert_allclose(out[b].numpy(), ref[0, 1:].reshape(2, 2), rtol=1e-5)
    assert out.shape == (2, 2, 2) and float(out.sum(dim=(1, 2)).max()) <= 1.0


def test_rollout_of_identity_attention_stays_on_the_class_token():
    eye = torch.eye(5).expand(1, 2, 5, 5)
    assert torch.equal(
        attention_rollout([eye, eye], num_prefix_tokens=1, grid=(2, 2)), torch.zeros(1, 2, 2)
    )
    with pytest.raises(ValueError, match="unknown head_fusion 'median'"):
        attention_rollout([eye], num_prefix_tokens=1, grid=(2, 2), head_fusion="median")


def test_cls_attention_per_head():
    a = _random_attention(1, 2, 6, 0)  # 2 prefix tokens + 2x2 patches
    out = cls_attention(a, num_prefix_tokens=2, grid=(2, 2))
    assert out.shape == (1, 2, 2, 2)
    assert torch.equal(out[0, 1].flatten(), a[0, 1, 0, 2:])


def test_attention_maps_from_a_model(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_digits", depth=2, distilled=True)
    images = torch.randn(3, 1, 8, 8)
    maps = attention_maps(model, images)
    assert maps["logits"].shape == (3, 10)
    assert maps["rollout"].shape == (3, 4, 4)
    assert maps["cls_attention_heads"].shape == (3, 4, 4, 4)
    assert torch.allclose(maps["cls_attention"], maps["cls_attention_heads"].mean(1))
    path = tmp_path / "x.png"
    draw_explanation(
        images[0].sigmoid(), {k: v[0] for k, v in maps.items()}, path, title="test", per_head=True
    )
    assert path.read_bytes()[:8] == PNG


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
