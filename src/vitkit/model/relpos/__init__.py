"""The relative-position ViT family's room (timm's `vision_transformer_relpos.py`): ViTs without
absolute positions whose attention adds Swin V2's log-coordinate relative position bias
(layers/rel_pos_mlp.py), per block or shared, with pre- or post-norm blocks. `RELPOS` is the
record the registry keeps.

Liu et al., "Swin Transformer V2: Scaling Up Capacity and Resolution" (CVPR 2022), Section 3.3;
Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021).
"""

from ..architecture import Architecture
from ..features import ViTBackbone
from .config import RelPosConfig
from .presets import relpos_presets
from .relpos import RelPosViT

RELPOS = Architecture(
    name="relpos",
    title="relative-position ViT",
    config_class=RelPosConfig,
    build=RelPosViT,
    model_classes=(RelPosViT,),
    presets=relpos_presets(),
    backbone=ViTBackbone,  # RelPosViT's forward_intermediates takes the ViT's arguments
    feature_unit="block",
    # the weights returned are the softmax of the biased scores, the ones v is multiplied by
    explanation="attention",
    fused_cpu=False,  # the CPU fast path's blocks add no relative position bias
    fixed_export_size="a relative-position ViT exports at its fixed image size (the bias is "
    "built for its patch grid)",
)

__all__ = ["RELPOS", "RelPosConfig", "RelPosViT"]
