"""Relative-position ViT weights out as other libraries' folders: none is written yet, each
refused in one line that says what to export instead (Hugging Face's transformers has no model
of timm's `vision_transformer_relpos.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

_INSTEAD = "export --format onnx, or keep vitkit's own checkpoint (vitkit.save)"


def refuse_hf_folder(model: nn.Module, folder: str | os.PathLike) -> Path:
    raise ValueError(
        "Hugging Face's transformers has no model of timm's vision_transformer_relpos.py; "
        f"{_INSTEAD}"
    )


def refuse_timm_folder(model: nn.Module, folder: str | os.PathLike) -> Path:
    raise ValueError(f"vitkit writes no timm folder of a relative-position ViT; {_INSTEAD}")
