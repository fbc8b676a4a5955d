"""Files the serving guide assumes: `model.safetensors`, a random one-block ViT of the digits'
8x8 greyscale images saved with the ten digit names, and `seven.png` / `three.png`, digits
of scikit-learn's set at 32x32."""

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits

import vitkit


def setup(folder: Path) -> None:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_digits", embed_dim=16, depth=1, num_heads=2)
    names = [str(d) for d in range(10)]
    vitkit.save(model, folder / "model.safetensors", meta={"class_names": names})
    digits = load_digits()
    for name, digit in (("seven", 7), ("three", 3)):
        index = int(np.flatnonzero(digits.target == digit)[0])
        array = (digits.images[index] * 255 / 16).astype("uint8")
        Image.fromarray(array).resize((32, 32)).save(folder / f"{name}.png")
