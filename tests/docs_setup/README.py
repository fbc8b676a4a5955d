"""README.md's quick starts: a folder of photos in two classes and, in place of the Hub
download, timm's ViT-S/16 with random weights saved as the Hub folder has it, and a narrow
Swin-T saved the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def photos(folder: Path, per_class: int = 8) -> None:
    """photos/{circle,square}/N.jpg: 96x96 shapes on noise, one shape per class."""
    rng = np.random.default_rng(0)
    for label in ("circle", "square"):
        (folder / label).mkdir(parents=True)
        for i in range(per_class):
            image = Image.fromarray(rng.integers(0, 120, (96, 96, 3), dtype=np.uint8))
            x, y, r = (int(v) for v in rng.integers((20, 20, 12), (76, 76, 20)))
            draw = ImageDraw.Draw(image)
            shape = draw.ellipse if label == "circle" else draw.rectangle
            shape((x - r, y - r, x + r, y + r), fill=(240, 220, 40))
            image.save(folder / label / f"{i}.jpg", quality=90)


def setup(folder: Path) -> None:
    import timm
    from timm.models import save_for_hf

    photos(folder / "photos")
    model = timm.create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", pretrained=False)
    save_for_hf(model, folder / "vit-s16", safe_serialization=True)
    swin = timm.create_model(
        "swin_tiny_patch4_window7_224", pretrained=False, embed_dim=32, num_heads=(1, 2, 4, 8),
        depths=(1, 1, 2, 1), num_classes=5,
    )  # fmt: skip
    save_for_hf(swin, folder / "swin-t", safe_serialization=True)
