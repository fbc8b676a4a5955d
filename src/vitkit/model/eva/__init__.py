"""The EVA family's room (timm's `eva.py`): EVA, EVA-02, RoPE-ViT, Perception Encoder, DINOv3
and the models built the same way, as one model with rotary positions (layers/rope.py).
`EVA` is the record the registry keeps.

Fang et al., "EVA" (CVPR 2023) and "EVA-02" (2024); Heo et al., "Rotary Position Embedding for
Vision Transformer" (ECCV 2024); Bolya et al., "Perception Encoder" (2025); Simeoni et al.,
"DINOv3" (2025).
"""

from ..architecture import Architecture
from ..features import ViTBackbone
from .config import EvaConfig
from .eva import Eva
from .presets import eva_presets

EVA = Architecture(
    name="eva",
    title="EVA",
    config_class=EvaConfig,
    build=Eva,
    model_classes=(Eva,),
    presets=eva_presets(),
    backbone=ViTBackbone,  # Eva's forward_intermediates has the ViT's signature
    feature_unit="block",
    # Rotary positions rotate q and k before the scores: the weights each block hands back are
    # the softmax its forward pass multiplies v by, so rollout and relevance read them as a
    # ViT's. Register tokens are prefix tokens, skipped as the ViT's are.
    explanation="attention",
    fused_cpu=True,  # eva/onednn.py: rotary attention in the fused CPU blocks
)

__all__ = ["EVA", "Eva", "EvaConfig"]
