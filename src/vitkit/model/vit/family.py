"""A family of timm names as one table row: a name template, the family's `ViTConfig`
options and the size / patch / resolution variants timm registers, decoded over `TIMM_SIZES`
(as big_vision decodes `B/16`). The registry (registry.py) and the preset modules
(presets_*.py) write their rows with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import ViTConfig

# size name -> (embed_dim, depth, num_heads); MLP ratio 4 throughout (paper Table 1).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}

# timm's widths beyond the paper's: name -> (embed_dim, depth, num_heads, mlp_ratio).
TIMM_SIZES: dict[str, tuple[int, int, int, float]] = {
    **{name: (*row, 4.0) for name, row in SIZES.items()},
    "xsmall": (256, 10, 4, 4.0),
    "medium": (512, 12, 8, 4.0),
    "mediumd": (512, 20, 8, 4.0),
    "betwixt": (640, 12, 10, 4.0),
    "little": (320, 14, 5, 5.6),
    "wee": (256, 14, 4, 5.0),
    "giant": (1408, 40, 16, 48 / 11),
    "gigantic": (1664, 48, 16, 64 / 13),
    "giantopt": (1536, 40, 16, 4.0),
    "so150m": (896, 18, 14, 2.572),
    "so150m2": (832, 21, 13, 2.6153846153846154),
    "so400m": (1152, 27, 16, 3.7362),
    "intern300m": (1024, 24, 16, 4.0),
}


@dataclass(frozen=True)
class Family:
    """timm names `template.format(size=, patch=, res=)`, one per variant.

    Args:
        template: the name pattern.
        variants: space-separated 'size/patch/res', with ':classes' when timm's head differs
            from `classes`.
        options: `ViTConfig` fields on top of the size row.
        sizes: this family's own size rows, over `TIMM_SIZES`.
        classes: the head size of timm's model.
    """

    template: str
    variants: str
    options: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, tuple[int, int, int, float]] = field(default_factory=dict)
    classes: int = 1000

    def configs(self) -> dict[str, ViTConfig]:
        """Name -> config of every variant."""
        out = {}
        for variant in self.variants.split():
            spec, _, classes = variant.partition(":")
            size, patch, res = spec.split("/")
            dim, depth, heads, ratio = {**TIMM_SIZES, **self.sizes}[size]
            name = self.template.format(size=size, patch=patch, res=res)
            out[name] = ViTConfig(
                **{
                    "img_size": int(res),
                    "patch_size": int(patch),
                    "embed_dim": dim,
                    "depth": depth,
                    "num_heads": heads,
                    "mlp_ratio": ratio,
                    "num_classes": int(classes) if classes else self.classes,
                    **self.options,
                }
            )
        return out
