"""timm's `eva.py` names as rows of a table: a name template, the variants it registers
('size/patch/res', ':classes' where timm's head is not 1000 wide) and the options of the kind.

The kinds: EVA (Fang et al. 2023), EVA-02 (Fang et al. 2024), timm's RoPE ViTs with registers,
Perception Encoder core / lang / spatial (Bolya et al. 2025), RoPE-ViT axial / mixed, with and
without absolute positions (Heo et al. 2024), DINOv3 (Simeoni et al. 2025) and the models built
the same way (LingBot-Vision, Sapiens2). Every row is timm's `Eva` arguments, parameter for
parameter.
"""

from __future__ import annotations

from typing import Any

from .config import EvaConfig

# size -> (embed_dim, depth, num_heads[, mlp_ratio]); a row's own sizes come before these.
EVA_SIZES: dict[str, tuple[float, ...]] = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "small_plus": (384, 12, 6),
    "medium": (512, 12, 8),
    "mediumd": (512, 20, 8),
    "betwixt": (640, 12, 10),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
    "huge_plus": (1280, 32, 20),
    "giant": (1408, 40, 16, 6144 / 1408),  # EVA-g
    "gigantic": (1536, 50, 16, 8960 / 1536),  # PE-G
    "enormous": (1792, 64, 16, 15360 / 1792),  # EVA-02-E
    "7b": (4096, 40, 32, 2.0),
    "5b": (2432, 56, 32),
}
_GIANT_24 = {"giant": (1536, 40, 24)}  # LingBot-Vision and Sapiens2's giant
NATIVE_GRID = "native"  # ref_feat_shape: the patch grid at the row's resolution

EVA02 = dict(mlp_ratio=4 * 2 / 3, swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(16, 16))
EVA02_BL = {**EVA02, "qkv_fused": False, "scale_mlp": True}
ROPE_REG = dict(
    init_values=1e-5,
    class_token=False,
    num_reg_tokens=1,
    use_rot_pos_emb=True,
    use_abs_pos_emb=False,
    ref_feat_shape=(16, 16),
)
PE = dict(
    attn_type="rope",
    use_pre_transformer_norm=True,
    use_rot_pos_emb=True,
    rope_grid_indexing="xy",
    norm_eps=1e-5,
)
PE_CORE = {**PE, "global_pool": "map", "attn_pool_num_heads": 8, "attn_pool_mlp_ratio": 4.0,
           "ref_feat_shape": NATIVE_GRID}  # fmt: skip
PE_DENSE = {**PE, "use_post_transformer_norm": False, "use_fc_norm": False,
            "ref_feat_shape": (32, 32)}  # fmt: skip
NAVER = dict(
    attn_type="rope",
    init_values=1e-5,
    global_pool="token",
    use_rot_pos_emb=True,
    rope_grid_indexing="xy",
)
AXIAL = {**NAVER, "use_abs_pos_emb": False, "rope_temperature": 100.0}
MIXED = {**NAVER, "use_abs_pos_emb": False, "rope_temperature": 10.0, "rope_type": "mixed"}
APE = dict(no_embed_class=True, use_abs_pos_emb=True)
DINOV3 = dict(
    dynamic_img_size=True,
    init_values=1e-5,
    rope_type="dinov3",
    rope_temperature=100.0,
    rope_rotate_half=True,
    use_rot_pos_emb=True,
    use_abs_pos_emb=False,
    num_reg_tokens=4,
    use_fc_norm=False,
    norm_eps=1e-5,
)
SWIGLU_8 = dict(swiglu_mlp=True, swiglu_align_to=8)
SAPIENS2 = dict(
    dynamic_img_size=True,
    attn_type="rope",
    qkv_fused=False,
    qk_norm=True,
    global_pool="token",
    swiglu_mlp=True,
    init_values=1.0,
    attn_only_layer_scale=True,
    rope_type="dinov3",
    rope_temperature=100.0,
    rope_rotate_half=True,
    rope_rescale_coords=2.0,
    use_rot_pos_emb=True,
    use_abs_pos_emb=False,
    num_reg_tokens=8,
    use_fc_norm=False,
    norm_layer="rmsnorm",
)
# Sapiens2's grouped-query attention: key / value heads of its middle blocks (the first and the
# last eight keep every head).
SAPIENS2_KV_HEADS = {"base": 6, "large": 8, "huge": 8, "giant": 12, "5b": 16}

# (name template, variants, options, the row's own sizes)
EVA_ROWS: tuple[tuple[str, str, dict[str, Any], dict[str, tuple[float, ...]]], ...] = (
    ("eva_{size}_patch{patch}_{res}", "giant/14/224 giant/14/336 giant/14/560", {}, {}),
    ("eva_{size}_patch{patch}_clip_{res}", "giant/14/224:1024", dict(global_pool="token"), {}),
    (
        "eva02_{size}_patch{patch}_{res}",
        "tiny/14/224:0 small/14/224:0 tiny/14/336 small/14/336",
        EVA02,
        {},
    ),  # fmt: skip
    (
        "eva02_{size}_patch{patch}_{res}",
        "base/14/224:0 large/14/224:0 base/14/448 large/14/448",
        EVA02_BL,
        {},
    ),  # fmt: skip
    (
        "eva02_{size}_patch{patch}_clip_{res}",
        "base/16/224:512 large/14/224:768 large/14/336:768",
        {**EVA02_BL, "scale_attn_inner": True, "global_pool": "token"},
        {},
    ),  # fmt: skip
    (
        "eva02_{size}_patch{patch}_clip_{res}",
        "enormous/14/224:1024",
        dict(use_post_norm=True, global_pool="token"),
        {},
    ),  # fmt: skip
    ("vit_{size}_patch{patch}_rope_reg1_gap_{res}", "medium/16/256 base/16/256", ROPE_REG, {}),
    (
        "vit_{size}_patch{patch}_rope_reg1_gap_{res}",
        "mediumd/16/256",
        {**ROPE_REG, "qkv_bias": False},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_rope_reg4_gap_{res}",
        "betwixt/16/256",
        {**ROPE_REG, "num_reg_tokens": 4},
        {},
    ),  # fmt: skip
    (
        "vit_pe_core_{size}_patch{patch}_{res}",
        "tiny/16/384:512 small/16/384:512 base/16/224:1024 large/14/336:1024",
        {**PE_CORE, "rope_grid_offset": 1.0},
        {},
    ),  # fmt: skip
    (
        "vit_pe_core_{size}_patch{patch}_{res}",
        "gigantic/14/448:1280",
        {**PE_CORE, "class_token": False},
        {},
    ),  # fmt: skip
    (
        "vit_pe_lang_{size}_patch{patch}_{res}",
        "large/14/448:0",
        {**PE_DENSE, "init_values": 0.1, "rope_grid_offset": 1.0},
        {"large": (1024, 23, 16)},
    ),
    (
        "vit_pe_lang_{size}_patch{patch}_{res}",
        "gigantic/14/448:0",
        {**PE_DENSE, "init_values": 0.1, "class_token": False},
        {"gigantic": (1536, 47, 16, 8960 / 1536)},
    ),  # fmt: skip
    (
        "vit_pe_spatial_{size}_patch{patch}_{res}",
        "tiny/16/512:0 small/16/512:0 base/16/512:0 large/14/448:0",
        {**PE_DENSE, "rope_grid_offset": 1.0},
        {},
    ),  # fmt: skip
    (
        "vit_pe_spatial_{size}_patch{patch}_{res}",
        "gigantic/14/448:0",
        {**PE_DENSE, "init_values": 0.1, "class_token": False},
        {},
    ),  # fmt: skip
    ("vit_{size}_patch{patch}_rope_{res}", "small/16/224 base/16/224 large/16/224", AXIAL, {}),
    (
        "vit_{size}_patch{patch}_rope_ape_{res}",
        "small/16/224 base/16/224 large/16/224",
        {**AXIAL, **APE},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_rope_mixed_{res}",
        "small/16/224 base/16/224 large/16/224",
        MIXED,
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_rope_mixed_ape_{res}",
        "small/16/224 base/16/224 large/16/224",
        {**MIXED, **APE},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_dinov3",
        "small/16/256:0 base/16/256:0 large/16/256:0",
        {**DINOV3, "qkv_bias": False},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_dinov3_qkvb",
        "tiny/16/256:0 small/16/256:0 base/16/256:0 large/16/256:0",
        DINOV3,
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_dinov3",
        "small_plus/16/256:0 huge_plus/16/256:0",
        {**DINOV3, **SWIGLU_8, "qkv_bias": False},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_dinov3_qkvb",
        "small_plus/16/256:0 huge_plus/16/256:0",
        {**DINOV3, **SWIGLU_8},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_dinov3",
        "7b/16/256:0",
        {**DINOV3, "qkv_bias": False, "swiglu_mlp": True, "swiglu_align_to": 64},
        {},
    ),
    (
        "vit_{size}_patch{patch}_lingbot",
        "small/16/512:0 base/16/512:0 large/16/512:0",
        {**DINOV3, "global_pool": "token"},
        {},
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_lingbot",
        "giant/16/512:0",
        {**DINOV3, **SWIGLU_8, "global_pool": "token", "qkv_bias": False, "mlp_ratio": 4 * 2 / 3},
        _GIANT_24,
    ),  # fmt: skip
    (
        "vit_{size}_patch{patch}_sapiens2",
        "base/16/1024x768:0 large/16/1024x768:0 huge/16/1024x768:0 giant/16/1024x768:0 "
        "5b/16/1024x768:0",
        SAPIENS2,
        _GIANT_24,
    ),  # fmt: skip
)


def sapiens2_kv_heads(size: str, depth: int, heads: int, full_blocks: int = 8) -> tuple[int, ...]:
    """Sapiens2's key / value heads per block: every head in the first and last `full_blocks`,
    `SAPIENS2_KV_HEADS[size]` between."""
    middle = SAPIENS2_KV_HEADS[size]
    return tuple(
        heads if i < full_blocks or i >= depth - full_blocks else middle for i in range(depth)
    )


def eva_presets() -> dict[str, EvaConfig]:
    """Name -> config of every row's variants."""
    out = {}
    for template, variants, options, own_sizes in EVA_ROWS:
        for variant in variants.split():
            spec, _, classes = variant.partition(":")
            size, patch, res = spec.split("/")
            dim, depth, heads, *ratio = {**EVA_SIZES, **own_sizes}[size]
            sides = tuple(int(side) for side in res.split("x"))
            img_size = sides[0] if len(sides) == 1 else sides
            row = dict(options)
            if row.get("ref_feat_shape") == NATIVE_GRID:
                row["ref_feat_shape"] = (sides[0] // int(patch), sides[-1] // int(patch))
            if "sapiens2" in template:
                row["num_kv_heads"] = sapiens2_kv_heads(size, int(depth), int(heads))
            if ratio:
                row.setdefault("mlp_ratio", ratio[0])
            name = template.format(size=size, patch=patch, res=res)
            out[name] = EvaConfig(
                img_size=img_size,
                patch_size=int(patch),
                embed_dim=int(dim),
                depth=int(depth),
                num_heads=int(heads),
                num_classes=int(classes) if classes else 1000,
                **row,
            )
    return out
