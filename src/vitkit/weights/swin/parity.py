"""The Swin's own parity checks (`parity.check_parity` asks them through the weights
registry): torchvision weights against torchvision's `SwinTransformer` of their sizes, and the
sizes of a timm Swin that the weights show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...model import SwinConfig, SwinTransformer
from ..checkpoint import load_state_dict, weights_file
from ..reference import Outputs, Parity, not_installed, run, strict_load
from .torchvision import torchvision_swin_builder, torchvision_swin_model


def timm_sizes(config: SwinConfig) -> dict[str, Any]:
    """The sizes of a timm Swin the weights show and that can differ from its name's without
    another function: width, depths, heads, classes, channels, resolution and windows."""
    return {
        "embed_dim": config.embed_dim,
        "depths": config.depths,
        "num_heads": config.num_heads,
        "num_classes": config.num_classes,
        "in_chans": config.in_chans,
        "img_size": config.img_size,
        "window_size": config.windows,
    }


def torchvision_parity(model: SwinTransformer, path: Path, given: dict[str, Any]) -> Parity:
    """torchvision's SwinTransformer of the weights' sizes (the builder's name where they are
    one's), loaded strictly, at the converted model's image size."""
    builder = torchvision_swin_builder(model.config)
    reference = f"torchvision {builder or 'SwinTransformer'}"
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return not_installed("torchvision", reference)
    weights = load_state_dict(weights_file(path))

    def outputs() -> Outputs:
        built = torchvision_swin_model(model.config).eval()
        strict_load(built, weights)
        return lambda x: {"output": built(x)}

    return run(model, outputs, reference=reference, scope="function")
