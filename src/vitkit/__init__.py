"""vitkit: Vision Transformers on PyTorch, faithful to "An Image is Worth 16x16 Words"."""

from . import convert
from .checkpoint import CheckpointError, DiskFullError, load, load_state_dict, save
from .config import ViTConfig
from .export import export_onnx
from .features import ViTBackbone
from .model import VisionTransformer
from .pretrained import load_pretrained
from .registry import create_model, get_config, list_models
from .summary import summary

__all__ = [
    "CheckpointError",
    "DiskFullError",
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
