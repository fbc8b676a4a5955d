"""Files docs/guides/export.md assumes: a small vitkit checkpoint with random weights and three
class names, saved as a training run would (run/model.safetensors) and as model.safetensors."""

from __future__ import annotations

from pathlib import Path

import torch

import vitkit


def setup(folder: Path) -> None:
    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3
    )
    meta = {"class_names": ["cat", "dog", "fox"]}
    (folder / "run").mkdir()
    vitkit.save(model, folder / "run" / "model.safetensors", meta=meta)
    vitkit.save(model, folder / "model.safetensors", meta=meta)
