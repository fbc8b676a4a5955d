"""EVA weights out as other libraries' folders: a DINOv3 backbone as transformers'
`DINOv3ViTModel` folder, every other EVA and every timm folder refused in one line that says
why and what to export instead.

Hugging Face's transformers has one of timm's `eva.py` models, DINOv3 (`DINOv3ViTModel`, read
by `hf.py`): a faithful DINOv3 backbone is written as its folder (`config.json`,
`model.safetensors`, and the data config as `preprocessor_config.json`, as the ViT's,
`weights/vit/folders.py`); any other EVA, and a DINOv3 with a classification head (transformers
has no DINOv3 classifier), is refused naming the difference. A timm folder's `config.json` names
a model by timm's factory and JSON arguments, which carry neither a norm's epsilon (timm's
factories pass `partial(LayerNorm, eps=1e-5)` for PE and DINOv3) nor which factory's fixed
options a fine-tuned model kept, so no timm folder is a faithful copy in general. ONNX
(`vitkit export --format onnx`) and vitkit's own checkpoint are.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ...model.eva import Eva
from ..hub import model_data_config, write_hf_folder
from .hf import to_hf_dinov3, to_hf_dinov3_config

_INSTEAD = "export --format onnx, or keep vitkit's own checkpoint (vitkit.save)"


def save_hf_dinov3_folder(model: Eva, folder: str | os.PathLike) -> Path:
    """`config.json`, `model.safetensors` and `preprocessor_config.json` that
    `transformers.DINOv3ViTModel.from_pretrained` loads as the same model; refused before
    anything is written where DINOv3ViTModel cannot express the model."""
    state_dict = model.state_dict()
    hidden = state_dict["blocks.0.mlp.fc2.weight"].shape[1]
    try:
        config = to_hf_dinov3_config(model.config, hidden)
    except ValueError as err:
        raise ValueError(f"{err}; {_INSTEAD}") from None
    tensors = to_hf_dinov3(state_dict)
    return write_hf_folder(Path(folder), model, config, tensors, model_data_config(model))


def refuse_timm_folder(model: nn.Module, folder: str | os.PathLike) -> Path:
    raise ValueError(
        "a timm folder's config.json cannot carry an EVA's norm epsilon nor tell which timm "
        f"factory's fixed options it keeps; {_INSTEAD}"
    )
