"""What the model looks at: a ViT's attention maps (rollout, class-specific relevance, the
last block's class-token attention; attention.py), Grad-CAM for hierarchical models such as
the Swin (gradcam.py), which of them a model gets (method.py), and one image file explained
and drawn (image.py)."""

from .attention import (
    attention_maps,
    attention_rollout,
    class_index,
    cls_attention,
    explained_classes,
    gradient_relevance,
    readout_of,
)
from .gradcam import grad_cam
from .image import (
    Explanation,
    draw_explanation,
    explain_image,
    map_title,
    overlay_figure,
    overlay_pixels,
    overlay_png,
)
from .method import MAPS, explanation_method

__all__ = [
    "MAPS",
    "Explanation",
    "attention_maps",
    "attention_rollout",
    "class_index",
    "cls_attention",
    "draw_explanation",
    "explain_image",
    "explained_classes",
    "explanation_method",
    "grad_cam",
    "gradient_relevance",
    "map_title",
    "overlay_figure",
    "overlay_pixels",
    "overlay_png",
    "readout_of",
]
