"""Weights in and out: safe checkpoints, and converters for timm, Hugging Face, torchvision and
the JAX npz files of google-research/vision_transformer, per model family. Imports the model
package only (and data's DataConfig).

    checkpoint   safetensors + config in the metadata; torch.load(weights_only=True)
    families     the weights registry: one WeightsFamily record per family, which the modules
                 here ask instead of naming a model class or reading a family's keys
    vit/ swin/   each family's converters in and out (from_* / to_*), key patterns, fitting,
                 folder exporters and parity checks
    detect       format detection and the converter of each format (any family)
    info         `inspect`: what a weights file or folder is, read once (`WeightsInfo`)
    pretrained   `load_pretrained`: any family's weights into a ready (or a given) model
    loading      `load` (a checkpoint vitkit wrote) and `load_any` (any weights, as they are)
    reference    `Parity` and the references every family shares (optional imports)
    parity       the converted model beside the source library's own model (`vitkit convert`)
    hub source preprocessing cnn   Hub files, what load_pretrained read, data configs, CNNs
"""

from .checkpoint import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    load_state_dict,
    save,
    weights_file,
)
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
