"""EVA weights out as other libraries' folders: none is written, each refused in one line that
says why and what to export instead. Hugging Face's transformers has none of timm's `eva.py`
models but DINOv3 (`DINOv3ViTModel`, read by `hf.py`; not written yet); a timm folder's
`config.json` names a model by timm's factory and JSON arguments, which carry neither a norm's
epsilon (timm's factories pass `partial(LayerNorm, eps=1e-5)` for PE and DINOv3) nor which
factory's fixed options a fine-tuned model kept, so no folder is a faithful copy in general.
ONNX (`vitkit export --format onnx`) and vitkit's own checkpoint are.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

_INSTEAD = "export --format onnx, or keep vitkit's own checkpoint (vitkit.save)"


def refuse_hf_folder(model: nn.Module, folder: str | os.PathLike) -> Path:
    raise ValueError(
        "Hugging Face folders are written for the ViT and the Swin; of timm's eva.py, "
        f"transformers has only DINOv3 (DINOv3ViTModel, which vitkit reads); {_INSTEAD}"
    )


def refuse_timm_folder(model: nn.Module, folder: str | os.PathLike) -> Path:
    raise ValueError(
        "a timm folder's config.json cannot carry an EVA's norm epsilon nor tell which timm "
        f"factory's fixed options it keeps; {_INSTEAD}"
    )
