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


def timm_vit(**options):
    """A random timm ViT-Ti of 32x32 inputs (patch 8, two blocks, three classes)."""
    import timm
    import torch

    torch.manual_seed(0)
    small = dict(img_size=32, patch_size=8, depth=2, num_classes=3)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**small, **options})


def timm_folder(path: Path, **options) -> Path:
    """`timm_vit` saved as a timm Hub folder (`save_for_hf`: config.json, model.safetensors)."""
    from timm.models._hub import save_for_hf

    save_for_hf(timm_vit(**options).eval(), str(path), safe_serialization=True)
    return path


def hf_folder(path: Path, labels=("cat", "dog", "eel")) -> Path:
    """A random Hugging Face ViTForImageClassification folder with its image processor."""
    import torch
    import transformers

    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(path)
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.4] * 3, image_std=[0.3] * 3
    )
    processor.save_pretrained(path)
    return path


def torchvision_pth(path: Path):
    """A random torchvision ViT (width 192: the standard 3 heads) saved as a state dict."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                 num_heads=3, hidden_dim=192, mlp_dim=384,
                                                 num_classes=4)  # fmt: skip
    torch.save(model.state_dict(), path)
    return model.eval()


def photo(path: Path, size=(50, 40)) -> Path:
    """A random RGB image of another size than the models'."""
    array = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(array).save(path)
    return path
