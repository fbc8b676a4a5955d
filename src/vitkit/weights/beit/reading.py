"""What the weights registry (`weights/families.py`) asks of the BEiT family's weights: the key
patterns that tell them in timm's and Hugging Face's layouts, the readers that take the reading
options every source is given, a timm folder's `model_args`, and the sizes of timm's model of
the weights (`vitkit convert`'s parity check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...model.beit import BeitConfig
from .hf import from_hf_beit, is_hf_beit
from .timm import from_timm_beit, is_beit_state_dict

# Reading options that are other families' or fitted later (`fill_beit`: the image size).
_OTHERS = ("fit_img_size", "folder_img_size", "new_head")
_SIZES = ("embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes", "in_chans", "img_size",
          "patch_size")  # fmt: skip


def timm_keys(keys: Sequence[str]) -> bool:
    return is_beit_state_dict(list(keys))


def hf_keys(keys: Sequence[str]) -> bool:
    return is_hf_beit(list(keys))


def read_timm(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, BeitConfig]:
    """`from_timm_beit`; a timm folder's img_size is the weights' (`folder_img_size`), and
    `load_pretrained`'s img_size fits them later (`fill_beit`)."""
    folder_img_size = options.pop("folder_img_size", None)
    for name in _OTHERS:
        options.pop(name, None)
    if folder_img_size is not None:
        options.setdefault("img_size", folder_img_size)
    return from_timm_beit(state_dict, **options)


def read_hf(state_dict: Mapping[str, Tensor], **options: Any) -> tuple[dict, BeitConfig]:
    """`from_hf_beit`; `load_pretrained`'s img_size fits the weights later (`fill_beit`)."""
    for name in _OTHERS:
        options.pop(name, None)
    return from_hf_beit(state_dict, **options)


def folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The `BeitConfig` options of a timm folder's `model_args` (timm's `Beit` arguments have
    the config's names): lists as tuples, timm's '' pooling as 'none'."""
    fields = BeitConfig.__dataclass_fields__
    options = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in model_args.items()
        if key in fields
    }
    if options.get("global_pool") == "":
        options["global_pool"] = "none"
    return options


def timm_sizes(config: BeitConfig) -> dict[str, Any]:
    """The sizes of timm's `Beit` the weights show and that can differ from its name's."""
    return {name: getattr(config, name) for name in _SIZES}
