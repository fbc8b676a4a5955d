"""Files docs/reference/errors.md assumes, from RANDOM weights: a vitkit checkpoint of the
digits model, the same weights as a bare state dict, and a folder with one good and one
unreadable image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from PIL import Image

import vitkit


def setup(folder: Path) -> None:
    torch.manual_seed(0)
    model = vitkit.create_model("vit_digits")
    vitkit.save(model, folder / "model.safetensors", meta={"class_names": list("0123456789")})
    safetensors.torch.save_file(model.state_dict(), folder / "weights.safetensors")
    images = folder / "images"
    images.mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8)
    Image.fromarray(pixels).save(images / "good.png")
    (images / "broken.png").write_bytes(b"not a picture")
