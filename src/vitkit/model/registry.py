"""Named model presets: `create_model('vit_base_patch16_224')` and `list_models()`.

Sizes are the paper's Table 1 (Ti and S from DeiT); a name `vit_{size}_patch{P}_{res}` decodes
into one row of `SIZES` plus the patch size and resolution, as big_vision decodes `B/16`.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Any

from .config import ViTConfig
from .vit import VisionTransformer

# size name -> (embed_dim, depth, num_heads); MLP ratio 4 throughout (paper Table 1).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}

_STANDARD_NAMES = (
    "vit_tiny_patch16_224",
    "vit_tiny_patch16_384",
    "vit_small_patch16_224",
    "vit_small_patch16_384",
    "vit_small_patch32_224",
    "vit_base_patch16_224",
    "vit_base_patch16_384",
    "vit_base_patch32_224",
    "vit_base_patch32_384",
    "vit_large_patch16_224",
    "vit_large_patch16_384",
    "vit_large_patch32_224",
    "vit_huge_patch14_224",
)

# Presets that are not a plain size/patch/resolution row.
_SPECIAL: dict[str, ViTConfig] = {
    # For the built-in 8x8 handwritten digits: 2x2 patches -> 16 tokens, 1 channel, 10 classes.
    "vit_digits": ViTConfig(
        img_size=8,
        patch_size=2,
        in_chans=1,
        num_classes=10,
        embed_dim=64,
        depth=4,
        num_heads=4,
        mlp_ratio=2.0,
        pos_embed="learn",
    ),
    # For 28x28 grey images (Fashion-MNIST, MNIST), sized by measurement for 2 CPU cores.
    "vit_mnist": ViTConfig(
        img_size=28,
        patch_size=7,
        in_chans=1,
        num_classes=10,
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
    ),
    # The paper's hybrid for the same images: three stride-2 conv layers (28 -> 14 -> 7 -> 4),
    # then 1x1 patches of the 4x4 feature map, so the same 16 tokens; it learns Fashion-MNIST
    # in a quarter of the epochs (README, "A real run").
    "vit_mnist_hybrid": ViTConfig(
        img_size=28,
        patch_size=1,
        in_chans=1,
        conv_stem=(32, 64, 128),
        num_classes=10,
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
    ),
}

_NAME = re.compile(r"vit_(?P<size>[a-z]+)_patch(?P<patch>\d+)_(?P<res>\d+)")


def _decode(name: str) -> ViTConfig:
    match = _NAME.fullmatch(name)
    assert match is not None and match["size"] in SIZES, name
    dim, depth, heads = SIZES[match["size"]]
    return ViTConfig(
        img_size=int(match["res"]),
        patch_size=int(match["patch"]),
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
    )


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern`, sorted."""
    names = sorted(_STANDARD_NAMES + tuple(_SPECIAL))
    return [name for name in names if fnmatch.fnmatch(name, pattern)]


def get_config(name: str) -> ViTConfig:
    """The preset `ViTConfig` of a registered name."""
    if name in _SPECIAL:
        return _SPECIAL[name]
    if name in _STANDARD_NAMES:
        return _decode(name)
    close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown model name {name!r}; {hint}see vitkit.list_models() for all names")


def create_model(name: str, **overrides: Any) -> VisionTransformer:
    """Build a registered model, e.g. `create_model('vit_small_patch16_224', num_classes=10)`."""
    return VisionTransformer(get_config(name).replace(**overrides))
