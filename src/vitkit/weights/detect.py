"""Which library a checkpoint comes from, and its converter.

The format is told from the key names, by asking every model family whether they are its
weights in that library's layout (`WeightsFamily.recognises`: timm's `vision_transformer.py`
and vitkit name the patch projection `patch_embed.proj`, Hugging Face's
`embeddings.patch_embeddings.projection`, torchvision's `conv_proj`, the npz files of
google-research/vision_transformer and big_vision `embedding/kernel`; the Swin's have their
own). A format has one converter for every family (`CONVERTERS`): the family that claims the
keys reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from .checkpoint import CheckpointError
from .families import reader, recognised

FORMATS = ("vitkit", "timm", "hf", "torchvision", "jax")
# The order formats are told in: the most particular key names first.
_DETECTION_ORDER = ("jax", "torchvision", "hf", "timm")

CONVERTERS: dict[str, Callable[..., tuple[dict[str, Tensor], Any]]] = {
    format: reader(format) for format in FORMATS
}


def detect_format(state_dict: Mapping[str, Any]) -> str:
    """'timm' (also vitkit's own keys), 'hf', 'torchvision' or 'jax', from the key names."""
    keys = list(state_dict)
    for format in _DETECTION_ORDER:
        if recognised(format, keys):
            return format
    raise CheckpointError(
        f"cannot tell the checkpoint format from its keys ({', '.join(keys[:4])}, ...); it is "
        f"none of {', '.join(FORMATS)}: pass format= if it is one of them"
    )
