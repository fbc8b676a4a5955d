"""The Vision Transformer's room: its config, model, presets, flow, fast path, and the models
built on it (MAE, ViTDet's feature pyramid). `VIT` is the record the registry keeps."""

from ..architecture import Architecture
from ..features import ViTBackbone
from .config import ViTConfig
from .mae import MaskedAutoencoder
from .presets import UNSUPPORTED_NAMES, vit_presets
from .vit import VisionTransformer

VIT = Architecture(
    name="vit",
    title="ViT",
    config_class=ViTConfig,
    build=VisionTransformer,
    model_classes=(VisionTransformer,),
    presets=vit_presets(),
    backbone=ViTBackbone,
    refused=UNSUPPORTED_NAMES,
    feature_unit="block",
    explanation="attention",
    fused_cpu=True,
    masked_autoencoder=MaskedAutoencoder,
)

__all__ = ["VIT", "ViTConfig", "VisionTransformer"]
