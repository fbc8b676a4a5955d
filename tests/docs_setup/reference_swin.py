"""Files docs/reference/swin.md assumes: a timm Hub folder of a narrow, one-channel Swin-T
with random weights (nothing is downloaded), and an 8x8 grey image."""

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
