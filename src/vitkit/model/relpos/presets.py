"""timm's `vision_transformer_relpos.py` names as rows of one table: the name, its sizes and the
options of its kind; every row is timm's `VisionTransformerRelPos` arguments.
"""

from __future__ import annotations

from .config import RelPosConfig

_FC = dict(qkv_bias=False, fc_norm=True)
_RPN = dict(qkv_bias=False, res_post_norm=True)

# name -> (patch_size, embed_dim, num_heads, options); depth 12 where not given
RELPOS_PRESETS: dict[str, tuple] = {
    "vit_relpos_base_patch32_plus_rpn_256": (32, 896, 14, dict(img_size=256, res_post_norm=True)),
    "vit_relpos_base_patch16_plus_240": (16, 896, 14, dict(img_size=240)),
    "vit_relpos_small_patch16_224": (16, 384, 6, _FC),
    "vit_relpos_medium_patch16_224": (16, 512, 8, _FC),
    "vit_relpos_base_patch16_224": (16, 768, 12, _FC),
    "vit_srelpos_small_patch16_224": (16, 384, 6, dict(qkv_bias=False, rel_pos_dim=384,
                                                       shared_rel_pos=True)),
    "vit_srelpos_medium_patch16_224": (16, 512, 8, dict(qkv_bias=False, rel_pos_dim=512,
                                                        shared_rel_pos=True)),
    "vit_relpos_medium_patch16_cls_224": (16, 512, 8, dict(qkv_bias=False, rel_pos_dim=256,
                                                           class_token=True, global_pool="token")),
    "vit_relpos_base_patch16_cls_224": (16, 768, 12, dict(qkv_bias=False, class_token=True,
                                                          global_pool="token")),
    "vit_relpos_base_patch16_clsgap_224": (16, 768, 12, dict(**_FC, class_token=True)),
    "vit_relpos_small_patch16_rpn_224": (16, 384, 6, _RPN),
    "vit_relpos_medium_patch16_rpn_224": (16, 512, 8, _RPN),
    "vit_relpos_base_patch16_rpn_224": (16, 768, 12, _RPN),
    "test_vit_relpos": (16, 96, 3, dict(**_FC, depth=9, mlp_ratio=2.0, img_size=160)),
}  # fmt: skip


def relpos_presets() -> dict[str, RelPosConfig]:
    """Every name of the table as its `RelPosConfig`."""
    return {
        name: RelPosConfig(patch_size=patch, embed_dim=dim, num_heads=heads, **options)
        for name, (patch, dim, heads, options) in RELPOS_PRESETS.items()
    }
