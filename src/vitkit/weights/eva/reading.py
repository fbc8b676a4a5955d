"""What the weights registry (`weights/families.py`) asks of the EVA family's weights: the key
patterns that tell them in timm's layout, the reader that takes the reading options every
source is given, a timm folder's `model_args`, and the sizes of timm's model of the weights
(`vitkit convert`'s parity check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...model.eva import EvaConfig
from .hf import from_hf_dinov3, is_hf_dinov3
from .timm import from_timm_eva, is_eva_state_dict

# Reading options that are other families' (a Swin's image size, the ViT's folder size).
_OTHERS = ("fit_img_size", "folder_img_size", "new_head")


def timm_keys(keys: Sequence[str]) -> bool:
    return is_eva_state_dict(list(keys))


def read_timm(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, EvaConfig]:
    """`from_timm_eva`; `load_pretrained`'s img_size fits the weights later (`fill_eva`),
    it is not theirs."""
    for name in _OTHERS:
        options.pop(name, None)
    return from_timm_eva(state_dict, **options)


def hf_keys(keys: Sequence[str]) -> bool:
    return is_hf_dinov3(list(keys))


def read_hf(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, EvaConfig]:
    """`from_hf_dinov3`: transformers' DINOv3 with the folder's `config.json`."""
    for name in (*_OTHERS, "arch"):
        options.pop(name, None)
    return from_hf_dinov3(state_dict, **options)


def folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The `EvaConfig` options of a timm folder's `model_args` (timm's `Eva` arguments have
    the config's names): lists as tuples, timm's '' pooling as 'none'."""
    fields = EvaConfig.__dataclass_fields__
    options = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in model_args.items()
        if key in fields
    }
    if options.get("global_pool") == "":
        options["global_pool"] = "none"
    return options


def timm_sizes(config: EvaConfig) -> dict[str, Any]:
    """The sizes of timm's `Eva` the weights show and that can differ from its name's."""
    sizes = {
        name: getattr(config, name)
        for name in (
            "embed_dim",
            "depth",
            "num_heads",
            "mlp_ratio",
            "num_classes",
            "in_chans",
            "img_size",
            "patch_size",
            "num_reg_tokens",
        )
    }
    if config.num_kv_heads:
        sizes["num_kv_heads"] = config.num_kv_heads
    return sizes
