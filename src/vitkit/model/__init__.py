"""The network: config, layers, position embeddings, the ViT, the Swin Transformer, presets
and backbones.

Imports nothing from the rest of vitkit; everything else builds on it.
"""

from .config import ViTConfig, patch_grid, to_2tuple
from .detection import SimpleFeaturePyramid
from .features import SwinBackbone, ViTBackbone
from .registry import create_model, get_config, list_models
from .swin import SwinConfig, SwinCrConfig, SwinTransformer, SwinTransformerV2Cr, build_swin
from .vit import VisionTransformer

__all__ = [
    "SimpleFeaturePyramid",
    "SwinConfig",
    "SwinCrConfig",
    "SwinTransformer",
    "SwinTransformerV2Cr",
    "build_swin",
    "SwinBackbone",
    "ViTBackbone",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "get_config",
    "list_models",
    "patch_grid",
    "to_2tuple",
]
