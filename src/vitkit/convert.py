"""The converters' public namespace: weights from timm, Hugging Face, torchvision and JAX, and
back (`from_timm`, `to_timm`, `from_hf`, `to_hf`, ...). The code lives in `vitkit.weights`."""

from .weights.convert import (
    CONVERTERS,
    FORMATS,
    STANDARD_HEADS,
    check_state_dict,
    default_num_heads,
    detect_format,
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

__all__ = [
    "CONVERTERS",
    "FORMATS",
    "STANDARD_HEADS",
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
]
