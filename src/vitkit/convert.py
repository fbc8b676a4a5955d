"""The converters' public namespace: weights from timm, Hugging Face, torchvision and JAX, and
back (`from_timm`, `to_timm`, `from_hf`, `to_hf`, ...). The code lives in `vitkit.weights`, one
module per source: `layout` (config inference, shape check), `timm`, `hf`, `torchvision`,
`jax`, `detect` (format detection, `weights_file`), `reference` (`source_model`) and `parity`
(`check_parity`: the converted model beside the source library's own model)."""

from .weights.detect import CONVERTERS, FORMATS, detect_format, weights_file
from .weights.hf import from_hf, to_hf, to_hf_config
from .weights.jax import from_jax
from .weights.layout import (
    STANDARD_HEADS,
    check_state_dict,
    default_num_heads,
    expected_shapes,
    infer_config,
)
from .weights.parity import Parity, check_parity
from .weights.reference import source_model
from .weights.timm import from_timm, timm_kwargs, to_timm
from .weights.torchvision import from_torchvision, torchvision_kwargs

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
