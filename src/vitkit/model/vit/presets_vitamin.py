"""timm's ViTamin (Chen et al., "ViTamin: Designing Scalable Vision Models in the
Vision-Language Era", CVPR 2024; timm's `vitamin.py`): a convolutional stem of MbConv stages
(layers/mbconv.py, `hybrid='mbconv'`) feeding ViT blocks whose MLP is a GeGLU normed at its
input (`mlp_layer='geglu'`), mean-pooled without a class token. The names are timm's,
parameter for parameter, their heads the width of their CLIP embedding.
"""

from __future__ import annotations

from .family import Family

# What every ViTamin shares (timm's `_create_vitamin` and its names' arguments).
_VITAMIN = dict(
    hybrid="mbconv", hybrid_layers=(2, 4), mlp_layer="geglu", class_token=False, global_pool="avg"
)

VITAMIN_FAMILIES: tuple[Family, ...] = (
    Family(
        "vitamin_{size}_{res}",
        "small/1/224:768",
        dict(_VITAMIN, hybrid_widths=(64, 128)),
        {"small": (384, 14, 6, 2.0)},
    ),
    Family(
        "vitamin_{size}_{res}",
        "base/1/224:768",
        dict(_VITAMIN, hybrid_widths=(128, 256)),
        {"base": (768, 14, 12, 2.0)},
    ),
    Family(
        "vitamin_{size}_{res}",
        "large/1/224:768 large/1/256:768 large/1/336:768 large/1/384:768 "
        "large2/1/224 large2/1/256 large2/1/336 large2/1/384",
        dict(_VITAMIN, hybrid_widths=(160, 320)),
        {"large": (1024, 31, 16, 2.0), "large2": (1024, 31, 16, 2.0)},
        classes=1024,
    ),
    Family(
        "vitamin_{size}_{res}",
        "xlarge/1/256 xlarge/1/336 xlarge/1/384",
        dict(_VITAMIN, hybrid_widths=(192, 384), pos_embed="none"),
        {"xlarge": (1152, 32, 16, 2.0)},
        classes=1152,
    ),
)
