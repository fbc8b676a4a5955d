"""timm's `beit.py` names as rows of a table: a name template, the variants it registers
('size/patch/res') and the options of the kind. Every BEiT timm registers has relative position
tables in each block instead of absolute positions; they differ in LayerScale's start.
"""

from __future__ import annotations

from typing import Any

from .config import BeitConfig

# size -> (embed_dim, depth, num_heads)
BEIT_SIZES: dict[str, tuple[int, int, int]] = {
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
}
REL_POS = dict(use_abs_pos_emb=False, use_rel_pos_bias=True)

# (name template, variants, options)
BEIT_ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("beit_{size}_patch{patch}_{res}", "base/16/224 base/16/384", {**REL_POS, "init_values": 0.1}),
    ("beit_{size}_patch{patch}_{res}", "large/16/224 large/16/384 large/16/512",
     {**REL_POS, "init_values": 1e-5}),
    ("beitv2_{size}_patch{patch}_{res}", "base/16/224 large/16/224",
     {**REL_POS, "init_values": 1e-5}),
)  # fmt: skip


def beit_presets() -> dict[str, BeitConfig]:
    """Name -> config of every row's variants."""
    out = {}
    for template, variants, options in BEIT_ROWS:
        for variant in variants.split():
            size, patch, res = variant.split("/")
            dim, depth, heads = BEIT_SIZES[size]
            name = template.format(size=size, patch=patch, res=res)
            out[name] = BeitConfig(
                img_size=int(res),
                patch_size=int(patch),
                embed_dim=dim,
                depth=depth,
                num_heads=heads,
                **options,
            )
    return out
