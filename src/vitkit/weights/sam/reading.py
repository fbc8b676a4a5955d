"""What the weights registry (`weights/families.py`) asks of the SAM ViT's weights: the key
patterns that tell them in timm's layout (and Meta's original one), the reader that takes the
reading options every source is given, a timm folder's `model_args`, and the sizes of timm's
model of the weights (`vitkit convert`'s parity check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...model.sam import SamConfig
from .timm import from_timm_sam, is_sam_state_dict

# Reading options that are other families' (a Swin's image size, the ViT's folder size).
_OTHERS = ("fit_img_size", "folder_img_size", "new_head")


def timm_keys(keys: Sequence[str]) -> bool:
    return is_sam_state_dict(list(keys))


def read_timm(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, SamConfig]:
    """`from_timm_sam`; `load_pretrained`'s img_size fits the weights later (`fill_sam`)."""
    for name in _OTHERS:
        options.pop(name, None)
    return from_timm_sam(state_dict, **options)


def folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The `SamConfig` options of a timm folder's `model_args` (timm's names): lists as
    tuples, timm's '' pooling as 'none', no neck (None) as 0."""
    fields = SamConfig.__dataclass_fields__
    options = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in model_args.items()
        if key in fields
    }
    if options.get("global_pool") == "":
        options["global_pool"] = "none"
    if "neck_chans" in options and not options["neck_chans"]:
        options["neck_chans"] = 0
    return options


def timm_sizes(config: SamConfig) -> dict[str, Any]:
    """The sizes of timm's `VisionTransformerSAM` the weights show."""
    names = (
        "embed_dim",
        "depth",
        "num_heads",
        "mlp_ratio",
        "num_classes",
        "in_chans",
        "img_size",
        "patch_size",
        "window_size",
        "global_attn_indexes",
        "neck_chans",
    )
    return {name: getattr(config, name) for name in names}
