"""Helpers of the command-line tests: the tiny run's flags, images and folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# A model and run small enough for 2 busy CPU cores.
TINY = (
    "--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
    "--lr", "5e-3", "--batch-size", "128", "--warmup-epochs", "0.5", "--no-progress",
)  # fmt: skip
PNG = b"\x89PNG\r\n\x1a\n"


def digit_png(path: Path, index: int, scale: int = 1) -> int:
    """Digit `index` of scikit-learn's digits as a greyscale PNG (`scale` times 8 px); its
    label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    array = (digits.images[index] * 255 / 16).round().astype(np.uint8)
    image = Image.fromarray(array, mode="L")
    if scale > 1:
        image = image.resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)
    image.save(path)
    return int(digits.target[index])


def image_folder(root: Path, classes=("a", "b"), per_class: int = 6, size: int = 8) -> Path:
    """An ImageFolder of random RGB PNGs."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            array = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(array).save(root / name / f"{i}.png")
    return root


def tiny_checkpoint(path: Path, class_names, **meta) -> Path:
    """A random one-block RGB ViT of 8x8 inputs saved with `class_names` (and `meta`)."""
    import torch

    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_digits", num_classes=len(class_names), in_chans=3, embed_dim=16, depth=1,
        num_heads=2,
    )  # fmt: skip
    vitkit.save(model, path, meta={"class_names": list(class_names), **meta})
    return path
