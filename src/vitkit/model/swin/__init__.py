"""The Swin Transformer (V1, V2 and timm's V2-cr: `cr.py`) beside the ViT: its config, window
geometry, window attention, stages and model, reusing the ViT's layers (`model/layers/`)."""

from .config import SwinConfig
from .cr import SwinTransformerV2Cr, build_swin
from .cr_config import SwinCrConfig
from .swin import SwinTransformer

__all__ = ["SwinConfig", "SwinCrConfig", "SwinTransformer", "SwinTransformerV2Cr", "build_swin"]
