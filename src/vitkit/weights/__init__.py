"""Weights in and out: safe checkpoints, and converters for timm, Hugging Face, torchvision and
the JAX npz files of google-research/vision_transformer, one module per source. Imports the
model package only.

    checkpoint   safetensors + config in the metadata; torch.load(weights_only=True)
    layout       vitkit's (= timm's) keys: config inference, expected shapes, the shape check
    timm hf torchvision jax   from_* / to_* converters of each source
    detect       format detection, the converter table, `weights_file` of a hub folder
    pretrained   `load_pretrained`: any of them into a ready (or a given) model
    reference    the source library's own model, for parity checks (optional imports)
"""

from .checkpoint import CheckpointError, load, load_state_dict, save
from .detect import weights_file
from .pretrained import load_pretrained

__all__ = [
    "CheckpointError",
    "load",
    "load_pretrained",
    "load_state_dict",
    "save",
    "weights_file",
]
