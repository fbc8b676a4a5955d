"""vitkit: Vision Transformers on PyTorch, faithful to "An Image is Worth 16x16 Words"."""

from . import convert
from .export import export_onnx
from .files import DiskFullError
from .model import (
    SwinBackbone,
    SwinConfig,
    SwinTransformer,
    VisionTransformer,
    ViTBackbone,
    ViTConfig,
    create_model,
    get_config,
    list_models,
)
from .summary import summary
from .weights import CheckpointError, load, load_pretrained, load_state_dict, save

__all__ = [
    "CheckpointError",
    "DiskFullError",
    "SwinConfig",
    "SwinTransformer",
    "SwinBackbone",
    "ViTBackbone",
    "ViTConfig",
    "VisionTransformer",
    "convert",
    "create_model",
    "export_onnx",
    "get_config",
    "list_models",
    "load",
    "load_pretrained",
    "load_state_dict",
    "save",
    "summary",
]

__version__ = "0.1.0"
