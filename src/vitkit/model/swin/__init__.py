"""The Swin Transformer (V1 and V2) beside the ViT: its config, window geometry, window
attention, stages and model, reusing the ViT's layers (`model/layers/`)."""

from .config import SwinConfig
from .swin import SwinTransformer

__all__ = ["SwinConfig", "SwinTransformer"]
