"""timm's `vision_transformer_sam.py` names as rows of one table: the name and its sizes; every
row is timm's `VisionTransformerSAM` arguments, with its pretrained config's classes (none for
the Segment Anything encoders, 1000 for the 224 classifier).
"""

from __future__ import annotations

from .config import SamConfig

# name -> (embed_dim, depth, num_heads, global_attn_indexes, options)
SAM_PRESETS: dict[str, tuple] = {
    "samvit_base_patch16": (768, 12, 12, (2, 5, 8, 11), {}),
    "samvit_large_patch16": (1024, 24, 16, (5, 11, 17, 23), {}),
    "samvit_huge_patch16": (1280, 32, 16, (7, 15, 23, 31), {}),
    "samvit_base_patch16_224": (768, 12, 12, (2, 5, 8, 11),
                                dict(img_size=224, use_abs_pos=False, neck_chans=0,
                                     num_classes=1000)),
}  # fmt: skip


def sam_presets() -> dict[str, SamConfig]:
    """Every name of the table as its `SamConfig`."""
    return {
        name: SamConfig(
            embed_dim=dim, depth=depth, num_heads=heads, global_attn_indexes=indexes, **options
        )
        for name, (dim, depth, heads, indexes, options) in SAM_PRESETS.items()
    }
