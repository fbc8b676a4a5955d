"""timm's ViTs with other blocks or heads, and its test models: parallel blocks (ViT-22B's
`ParallelScalingBlock`; Touvron et al.'s `ParallelThingsBlock`, two branches: the `_18x2_`
names), differential attention (Ye et al., "Differential Transformer", 2024) in plain or
parallel blocks, DeiT's distilled models (timm's `VisionTransformerDistilled`: a distillation
token and head) and timm's tiny `test_vit*` models. The names are timm's, parameter for
parameter; the layers are in layers/parallel.py and layers/diff_attention.py.
"""

from __future__ import annotations

from .family import Family

_REG1_GAP = dict(
    class_token=False, no_embed_class=True, reg_tokens=1, global_pool="avg", init_values=1e-5
)
_XP = dict(
    block="parallel_scaling",
    pre_norm=True,
    patch_bias=False,
    no_embed_class=True,
    norm_layer="rmsnorm",
    qkv_bias=False,
    qk_norm=True,
)
_TEST = dict(init_values=1e-5, class_token=False, reg_tokens=1)

BLOCK_FAMILIES: tuple[Family, ...] = (
    Family(
        "vit_{size}_patch{patch}_18x2_{res}",
        "small/16/224 base/16/224",
        dict(block="parallel_things", init_values=1e-5),
        {"small": (384, 18, 6, 4.0), "base": (768, 18, 12, 4.0)},
    ),
    Family("vit_{size}_patch{patch}_xp_{res}", "base/16/224 large/14/224 huge/14/224", _XP),
    Family(
        "vit_{size}_patch{patch}_reg1_gap_{res}",
        "pwee/16/256",
        dict(_REG1_GAP, block="parallel_scaling"),
        {"pwee": (256, 16, 4, 5.0)},
    ),
    Family(
        "vit_{size}_patch{patch}_reg1_gap_{res}",
        "dpwee/16/256",
        dict(_REG1_GAP, block="parallel_scaling", attn_layer="diff"),
        {"dpwee": (256, 16, 4, 5.0)},
    ),
    Family(
        "vit_{size}_patch{patch}_reg1_gap_{res}",
        "dwee/16/256 dlittle/16/256",
        dict(_REG1_GAP, attn_layer="diff"),
        {"dwee": (256, 14, 4, 5.0), "dlittle": (320, 14, 5, 5.6)},
    ),
    Family(
        "deit_{size}_distilled_patch{patch}_{res}",
        "tiny/16/224 small/16/224 base/16/224 base/16/384",
        dict(distilled=True),
    ),
    # timm's test models: `test_vit`, `test_vit2` ... at 160 pixels.
    Family("test_vit{size}", "/16/160", dict(dynamic_img_size=True), {"": (64, 6, 2, 3.0)}),
    Family(
        "test_vit{size}",
        "2/16/160",
        dict(_TEST, global_pool="avg", dynamic_img_size=True),
        {"2": (64, 8, 2, 3.0)},
    ),
    Family(
        "test_vit{size}",
        "3/16/160",
        dict(_TEST, global_pool="map", pool_include_prefix=True),
        {"3": (96, 9, 3, 2.0)},
    ),
    Family(
        "test_vit{size}",
        "4/16/160",
        dict(_TEST, global_pool="avg", dynamic_img_size=True, norm_layer="rmsnorm"),
        {"4": (96, 9, 3, 3.0)},
    ),
)
