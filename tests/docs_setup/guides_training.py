"""Files docs/guides/training.md assumes: a small photo folder and a timm ViT state dict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def setup(folder: Path) -> None:
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):  # pets/<class>/<image>: split by --val/--test-fraction
        classes = folder / "pets" / name
        classes.mkdir(parents=True)
        for i in range(10):
            pixels = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(classes / f"{i}.jpg")
    import timm  # the interop extra
    from safetensors.torch import save_file

    # a ViT-Ti in timm's format, random weights, 2 blocks at 32x32: the examples run in seconds
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, depth=2, img_size=32, patch_size=8
    )
    save_file(model.state_dict(), folder / "vit_ti.safetensors")
