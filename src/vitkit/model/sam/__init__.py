"""The SAM family's room (timm's `vision_transformer_sam.py`): Segment Anything's image encoder,
a ViT of window and global blocks with decomposed relative positions (layers/window.py) on
(B, H, W, D) maps, and a convolutional neck. `SAM` is the record the registry keeps.

Kirillov et al., "Segment Anything" (ICCV 2023); Li et al., "Exploring Plain Vision Transformer
Backbones for Object Detection" (ECCV 2022).
"""

from ..architecture import Architecture
from ..features import ViTBackbone
from .config import SamConfig
from .presets import sam_presets
from .sam import SamViT

SAM = Architecture(
    name="sam",
    title="SAM ViT",
    config_class=SamConfig,
    build=SamViT,
    model_classes=(SamViT,),
    presets=sam_presets(),
    backbone=ViTBackbone,  # SamViT's forward_intermediates takes the ViT's arguments ('NCHW')
    feature_unit="block",
    # No attention spans the image (windows in most blocks) for rollout, and the neck's map is
    # channels-first, not the (B, h, w, C) map Grad-CAM reads: no explanation.
    explanation=None,
    fused_cpu=False,  # the CPU fast path's blocks take tokens, not window maps
    fixed_export_size="a SAM ViT exports at a fixed image size (its window padding and the "
    "interpolation of its relative-position tables are computed from the size in Python)",
)

__all__ = ["SAM", "SamConfig", "SamViT"]
