"""The model registry: every family's `Architecture` record (architecture.py), registered
once, and the names of their presets: `create_model('vit_base_patch16_224')`, `list_models()`,
`architecture_of(model_or_config)`.

A family registers here and nowhere else (as timm's `register_model`); a name or an architecture
registered twice is refused. Callers ask the record of a model or config for what differs between
families instead of testing its class.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from typing import Any

from torch import nn

from .architecture import Architecture
from .beit import BEIT
from .eva import EVA
from .relpos import RELPOS
from .sam import SAM
from .swin import SWIN, SWIN_CR
from .vit import VIT

_ARCHITECTURES: dict[str, Architecture] = {}
_PRESETS: dict[str, Architecture] = {}  # preset name -> its architecture
_REFUSED: dict[str, str] = {}  # timm names vitkit does not implement -> why


def register(arch: Architecture) -> None:
    """Add a family: its record and every preset name; a name already taken is refused."""
    if arch.name in _ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} is registered already")
    taken = sorted(set(arch.presets) & (set(_PRESETS) | set(_REFUSED)))
    if taken:
        raise ValueError(f"{arch.title} presets {', '.join(taken)} are registered already")
    _ARCHITECTURES[arch.name] = arch
    _PRESETS.update(dict.fromkeys(arch.presets, arch))
    _REFUSED.update(arch.refused)


for _arch in (VIT, SWIN, SWIN_CR, EVA, BEIT, SAM, RELPOS):
    register(_arch)


def architectures() -> list[Architecture]:
    """Every registered family, in registration order."""
    return list(_ARCHITECTURES.values())


def get_architecture(name: str) -> Architecture:
    """The record registered as `name` ('vit', 'swin', ...)."""
    if name not in _ARCHITECTURES:
        known = ", ".join(_ARCHITECTURES)
        raise ValueError(f"unknown architecture {name!r}; registered: {known}")
    return _ARCHITECTURES[name]


def find_architecture(thing: Any) -> Architecture | None:
    """The record of a config, a model (by its class) or a wrapper holding a model
    (`.model`: a feature backbone), else None."""
    for arch in _ARCHITECTURES.values():
        if arch.owns(thing) or type(thing) in arch.model_classes:
            return arch
    inner = getattr(thing, "model", None)
    return find_architecture(inner) if isinstance(inner, nn.Module) else None


def architecture_of(thing: Any) -> Architecture:
    """As `find_architecture`, but a thing of no registered family is a ValueError."""
    arch = find_architecture(thing)
    if arch is None:
        raise ValueError(f"{type(thing).__name__} is not a model or config of a vitkit family")
    return arch


def build_model(config: Any) -> nn.Module:
    """The model of a config, built by its family."""
    return architecture_of(config).build(config)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern`, sorted."""
    return sorted(name for name in _PRESETS if fnmatch.fnmatch(name, pattern))


def get_config(name: str) -> Any:
    """The preset config of a registered name (a `ViTConfig` for a ViT name, a `SwinConfig`
    for a Swin's: the family's config class)."""
    if name in _PRESETS:
        return _PRESETS[name].presets[name]
    check_implemented(name)
    close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown model name {name!r}; {hint}see vitkit.list_models() for all names")


def check_implemented(name: str) -> None:
    """Refuse a timm name whose architecture vitkit does not implement, in one line with the
    reason; any other name passes (a vitkit name, a timm CNN's in a timm folder)."""
    if name in _REFUSED:
        raise ValueError(f"timm's {name} uses {_REFUSED[name]}, which vitkit does not implement")


def create_model(
    name: str,
    pretrained: bool = False,
    *,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    feature_cls: str = "getter",
    output_fmt: str = "NCHW",
    **overrides: Any,
) -> nn.Module:
    """Build a registered model, e.g. `create_model('vit_small_patch16_224', num_classes=10)`;
    the name's architecture record builds it (a Swin name: a Swin Transformer).

    With `features_only=True`, as timm: a pruned `ViTBackbone` whose forward returns the maps
    of blocks `out_indices` (an int n: the last n; timm's default 3), 'NCHW' or 'NLC' by
    `output_fmt`, described by `feature_info`; for a Swin a `SwinBackbone` of stage maps
    (default: every stage, as timm), 'NCHW' or timm's 'NHWC'. `feature_cls` is timm's name
    of the wrapper; vitkit has only 'getter' (features read through `forward_intermediates`).
    `pretrained` is timm's argument, for code written for timm: False builds random weights;
    True is refused (nothing is downloaded; `vitkit.load_pretrained` reads weights on disk
    and Hub ids from the local cache).
    """
    if pretrained:
        raise ValueError(
            f"create_model builds {name} with random weights and downloads nothing; load "
            "weights with vitkit.load_pretrained(SOURCE): a file, a timm / Hugging Face "
            "folder, or a Hub id in the local cache ('timm/NAME')"
        )
    if overrides.get("global_pool") == "":
        overrides["global_pool"] = "none"  # timm's spelling
    config = get_config(name)
    arch = architecture_of(config)
    if not features_only:
        if out_indices is not None or feature_cls != "getter" or output_fmt != "NCHW":
            raise ValueError(
                "out_indices, feature_cls and output_fmt describe a feature extractor; pass "
                "features_only=True with them"
            )
        return build_model(config.replace(**overrides))
    if feature_cls != "getter":
        raise ValueError(
            f"feature_cls={feature_cls!r} is not available for a {arch.title}, whose maps are "
            "read through forward_intermediates; pass feature_cls='getter' (the default)"
        )
    model = build_model(config.replace(**overrides))
    if out_indices is None:
        out_indices = arch.default_out_indices(config)
    return arch.backbone(model, out_indices, output_fmt=output_fmt, prune=True)
