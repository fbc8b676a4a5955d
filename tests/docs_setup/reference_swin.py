"""Files docs/reference/swin.md assumes: a timm Hub folder of a narrow, one-channel Swin-T
and a Hugging Face folder of a narrow Swin, with random weights (nothing is downloaded), and an
8x8 grey image."""

from __future__ import annotations

from pathlib import Path


def setup(folder: Path) -> None:
    import numpy as np
    import timm
    import torch
    from PIL import Image
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        in_chans=1,
        embed_dim=32,
        num_heads=(1, 2, 4, 8),
        depths=(1, 1, 2, 1),
    )
    save_for_hf(model, str(folder / "swin-tiny-timm"), safe_serialization=True)
    Image.fromarray(np.full((8, 8), 128, dtype=np.uint8)).save(folder / "digit.png")
    _hf_folder(folder / "swin-hf")


def _hf_folder(path: Path) -> None:
    """A narrow Hugging Face SwinForImageClassification of 64x64 inputs, random weights."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.SwinConfig(
        embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], image_size=64, patch_size=2,
        window_size=4, num_labels=10,
    )  # fmt: skip
    transformers.SwinForImageClassification(config).save_pretrained(path)
