"""The network: the shared layers, one room per family (`vit/`, `swin/`), each described by an
`Architecture` record, and the registry of records and preset names.

Imports nothing from the rest of vitkit but `options`; everything else builds on it.
"""

from .architecture import Architecture
from .features import ViTBackbone
from .layers.patch_embed import patch_grid, to_2tuple
from .registry import (
    architecture_of,
    architectures,
    build_model,
    check_implemented,
    create_model,
    find_architecture,
    get_architecture,
    get_config,
    list_models,
)
from .swin import SwinBackbone, SwinConfig, SwinCrConfig, SwinTransformer, SwinTransformerV2Cr
from .vit import VisionTransformer, ViTConfig
from .vit.detection import SimpleFeaturePyramid

__all__ = [
    "Architecture",
    "SimpleFeaturePyramid",
    "SwinBackbone",
    "SwinConfig",
    "SwinCrConfig",
    "SwinTransformer",
    "SwinTransformerV2Cr",
    "ViTBackbone",
    "ViTConfig",
    "VisionTransformer",
    "architecture_of",
    "architectures",
    "build_model",
    "check_implemented",
    "create_model",
    "find_architecture",
    "get_architecture",
    "get_config",
    "list_models",
    "patch_grid",
    "to_2tuple",
]
