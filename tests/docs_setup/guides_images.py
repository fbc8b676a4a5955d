"""Files docs/guides/images.md assumes: a photo folder with split folders and a timm Hub folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def setup(folder: Path) -> None:
    rng = np.random.default_rng(0)
    counts = {"train": 8, "valid": 2, "test": 2, "dev": 1}
    for split, count in counts.items():
        for name in ("cat", "dog"):
            classes = folder / "photos" / split / name
            classes.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(classes / f"{i}.jpg")
    (folder / "photos" / "train" / "dog" / "broken.jpg").write_bytes(b"not an image")
    (folder / "photos" / "train" / "dog" / "notes.txt").write_text("where these came from")

    import timm  # the interop extra
    from safetensors.torch import save_file

    # a timm Hub folder (config.json + model.safetensors): ViT-Ti, random weights, 2 blocks at
    # 32x32, trained (say) with ImageNet's statistics and crop_pct 0.875
    args = {"depth": 2, "img_size": 32, "patch_size": 8}
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args)
    hub = folder / "hub-vit"
    hub.mkdir()
    save_file(model.state_dict(), hub / "model.safetensors")
    data_config = {
        "input_size": [3, 32, 32],
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "interpolation": "bicubic",
        "crop_pct": 0.875,
        "crop_mode": "center",
    }
    config = {
        "architecture": "vit_tiny_patch16_224",
        "num_classes": 1000,
        "model_args": args,
        "pretrained_cfg": {**data_config, "num_classes": 1000},
    }
    (hub / "config.json").write_text(json.dumps(config))
