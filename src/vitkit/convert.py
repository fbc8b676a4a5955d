"""The converters' public namespace: weights from timm, Hugging Face, torchvision and JAX, and
back (`from_timm`, `to_timm`, `from_hf`, `to_hf`, ...). The code lives in `vitkit.weights`:
the ViT's converters in its room (`weights/vit/`: `layout` (config inference, shape check),
`timm`, `hf`, `torchvision`, `jax`, `reference` (`source_model`)), published by the weights
registry (`weights/families.py`); format detection (`detect`), `weights_file` and parity
(`check_parity`: the converted model beside the source library's own model) know no family.
`CONVERTERS` reads any family's weights of a format."""

from .weights.checkpoint import weights_file
from .weights.detect import CONVERTERS, FORMATS, detect_format
from .weights.families import (
    STANDARD_HEADS,
    check_state_dict,
    default_num_heads,
    expected_shapes,
    from_hf,
    from_jax,
    from_timm,
    from_torchvision,
    infer_config,
    source_model,
    timm_kwargs,
    to_hf,
    to_hf_config,
    to_timm,
    torchvision_kwargs,
)
from .weights.parity import Parity, check_parity

__all__ = [
    "CONVERTERS",
    "FORMATS",
    "Parity",
    "STANDARD_HEADS",
    "check_parity",
    "check_state_dict",
    "default_num_heads",
    "detect_format",
    "expected_shapes",
    "from_hf",
    "from_jax",
    "from_timm",
    "from_torchvision",
    "infer_config",
    "source_model",
    "timm_kwargs",
    "to_hf",
    "to_hf_config",
    "to_timm",
    "torchvision_kwargs",
    "weights_file",
]
