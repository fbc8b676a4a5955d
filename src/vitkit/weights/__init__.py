"""Weights in and out: safe checkpoints, and converters for timm, Hugging Face, torchvision and
the JAX npz files of google-research/vision_transformer, one module per source. Imports the
model package only.

    checkpoint   safetensors + config in the metadata; torch.load(weights_only=True)
    layout       vitkit's (= timm's) keys: config inference, expected shapes, the shape check
    timm hf torchvision jax   from_* / to_* converters of each source
    detect       format detection, the converter table, `weights_file` of a hub folder
    info         `inspect`: what a weights file or folder is, read once (`WeightsInfo`)
    pretrained   `load_pretrained`: any ViT weights into a ready (or a given) model
    loading      `load` (a checkpoint vitkit wrote) and `load_any` (any weights, as they are)
    reference    the source library's own model, and the name a source records (optional imports)
    parity       the converted model beside the source library's own model (`vitkit convert`)
"""

from .checkpoint import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    load_state_dict,
    save,
)
from .detect import weights_file
from .info import WeightsInfo, inspect
from .loading import load, load_any
from .pretrained import load_pretrained

__all__ = [
    "ArchMismatchError",
    "CheckpointError",
    "MissingOptionError",
    "WeightsInfo",
    "inspect",
    "load",
    "load_any",
    "load_pretrained",
    "load_state_dict",
    "save",
    "weights_file",
]
