"""timm's Swin names as rows of a table: a size (width, depths, heads), a window, a resolution
and the options of the row (version, per-stage windows, pre-training windows, head size).

The names and architectures are timm's (`swin_transformer.py`, `swin_transformer_v2.py`),
parameter for parameter; S3 is Chen et al., "Searching the Search Space of Vision
Transformer" (NeurIPS 2021), Swin with a window per stage.
"""

from __future__ import annotations

from typing import Any

from .config import SwinConfig
from .cr_config import SwinCrConfig

# size -> (embed_dim, depths, num_heads): paper Table 7 (Swin-T/S/B/L), S3's own depths.
SWIN_SIZES: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    "tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    "small": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    "base": (128, (2, 2, 18, 2), (4, 8, 16, 32)),
    "large": (192, (2, 2, 18, 2), (6, 12, 24, 48)),
    "s3_base": (96, (2, 2, 30, 2), (3, 6, 12, 24)),
}

_PRETRAINED_12 = dict(pretrained_window_sizes=(12, 12, 12, 6))

# (name template, 'size/window/res' variants (':classes' when timm's head is not 1000), options)
SWIN_ROWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "swin_{size}_patch4_window{window}_{res}",
        "tiny/7/224 small/7/224 base/7/224 base/12/384 large/7/224 large/12/384",
        {},
    ),
    ("swin_s3_{size}_{res}", "tiny/7/224", dict(window_size=(7, 7, 14, 7))),
    ("swin_s3_{size}_{res}", "small/7/224", dict(window_size=(14, 14, 14, 7))),
    ("swin_s3_base_{res}", "s3_base/7/224", dict(window_size=(7, 7, 14, 7))),
    (
        "swinv2_{size}_window{window}_{res}",
        "tiny/8/256 tiny/16/256 small/8/256 small/16/256 base/8/256 base/16/256 "
        "base/12/192:21841 large/12/192:21841",
        dict(version=2),
    ),
    (
        "swinv2_{size}_window12to{window}_192to{res}",
        "base/16/256 base/24/384 large/16/256 large/24/384",
        dict(version=2, **_PRETRAINED_12),
    ),
)


def swin_presets() -> dict[str, SwinConfig]:
    """Name -> config of every Swin preset (V2-cr's too: `swin_cr_presets`)."""
    out = {}
    for template, variants, options in SWIN_ROWS:
        for variant in variants.split():
            spec, _, classes = variant.partition(":")
            size, window, res = spec.split("/")
            dim, depths, heads = SWIN_SIZES[size]
            name = template.format(size=size, window=window, res=res)
            out[name] = SwinConfig(
                **{
                    "img_size": int(res),
                    "embed_dim": dim,
                    "depths": depths,
                    "num_heads": heads,
                    "window_size": int(window),
                    "num_classes": int(classes) if classes else 1000,
                    **options,
                }
            )
    return {**out, **swin_cr_presets()}


# timm's Swin V2-cr (`swin_transformer_v2_cr.py`): size -> (embed_dim, depths, num_heads,
# options); the huge heads differ between 224 and 384 in timm ("trying diff values").
SWIN_CR_SIZES: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24), {}),
    "small": (96, (2, 2, 18, 2), (3, 6, 12, 24), {}),
    "base": (128, (2, 2, 18, 2), (4, 8, 16, 32), {}),
    "large": (192, (2, 2, 18, 2), (6, 12, 24, 48), {}),
    "huge@224": (352, (2, 2, 18, 2), (8, 16, 32, 64), dict(extra_norm_period=6)),
    "huge@384": (352, (2, 2, 18, 2), (11, 22, 44, 88), dict(extra_norm_period=6)),
    "giant": (512, (2, 2, 42, 2), (16, 32, 64, 128), dict(extra_norm_period=6)),
}

# 'size/res' ('ns': an extra norm at the end of every stage); windows are the patch grid / 8.
SWIN_CR_VARIANTS = (
    "tiny/224 tiny/384 tiny_ns/224 small/224 small/384 small_ns/224 small_ns/256 base/224 "
    "base/384 base_ns/224 large/224 large/384 huge/224 huge/384 giant/224 giant/384"
)


def swin_cr_presets() -> dict[str, SwinCrConfig]:
    """Name -> config of every Swin V2-cr preset (`swinv2_cr_{size}[_ns]_{res}`)."""
    out = {}
    for variant in SWIN_CR_VARIANTS.split():
        size, res = variant.split("/")
        base = size.removesuffix("_ns")
        row = SWIN_CR_SIZES.get(f"{base}@{res}", SWIN_CR_SIZES.get(base))
        assert row is not None, variant
        dim, depths, heads, options = row
        out[f"swinv2_cr_{size}_{res}"] = SwinCrConfig(
            img_size=int(res),
            embed_dim=dim,
            depths=depths,
            num_heads=heads,
            extra_norm_stage=size.endswith("_ns"),
            **options,
        )
    return out
