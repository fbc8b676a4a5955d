"""Parity of converted weights with the source library's own model, run beside the vitkit model
on the same random batch (`vitkit convert`'s parity line).

A check is only as good as its reference. Built from vitkit's own inferred config, the source
library's generic model proves the key mapping, not the function: what the weights do not
record (the activation, the norm epsilon, the block order, the head count, the pooling) is
assumed on both sides alike. So the reference is the model the source itself describes where
one can be built: timm's model of its name (`arch=`, a timm folder's `architecture`, a vitkit
checkpoint's `model_name`, a timm training checkpoint's `arch` or `pretrained_cfg`), built by
`timm.create_model` and loaded strictly; transformers' model of the folder's (or the given)
`config.json`, read by its own `from_pretrained`; torchvision's builder of the weights' sizes
(`vit_b_16` ...); for JAX `.npz` files, timm's model of the name with the file read by timm's
own npz loader. Where none can be built, the check is said to be of the key mapping only, and
what was assumed is named (`Parity.line`), never reported as "ok".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model import (
    SwinConfig,
    SwinTransformer,
    VisionTransformer,
    ViTConfig,
    get_config,
    list_models,
)
from ..model.layers.patch_embed import to_2tuple
from ..model.vit.torch_encoder import torch_to_native_state_dict
from .checkpoint import OPTION_FORMS, load_state_dict
from .detect import weights_file
from .hf import hf_config_dict
from .info import inspect
from .layout import strip_prefix
from .reference import (
    Outputs,
    ReferenceMismatch,
    folder_model_args,
    hf_class,
    hf_outputs,
    hf_pretrained,
    quiet_transformers,
    recorded_name,
    source_model,
    strict_load,
    timm_outputs,
)
from .swin_torchvision import torchvision_swin_builder, torchvision_swin_model
from .torchvision import TORCHVISION_BUILDERS, torchvision_builder, torchvision_kwargs

# The largest |difference| accepted between the two models' outputs (float32, random weights).
PARITY_TOLERANCE = 1e-4


# torchvision builders' defaults of what the weights may change.
_TV_DEFAULTS = {"num_classes": 1000, "image_size": 224}
_INSTALL = "pip install 'vitkit[interop]'"
_ACTIVATIONS = {"gelu": "exact GELU", "gelu_tanh": "tanh GELU", "quick_gelu": "QuickGELU"}


@dataclass(frozen=True, kw_only=True)
class Parity:
    """What a parity check compared, and what it could not.

    Args:
        reference: the model run beside vitkit's ("timm vit_base_patch16_224 (depth=2)");
            None when none was built.
        scope: 'function' (the source's own description of the model), 'mapping' (the
            library's generic model built from vitkit's inferred config: the key mapping
            only) or None (nothing compared).
        difference: the largest |difference| of the outputs compared.
        compared: which outputs ('logits', 'tokens', 'pooled features').
        tolerance: the largest difference accepted.
        refused: why the named reference cannot hold the weights (a mismatch).
        note: why the check is not (or not fully) of the source's function.
        assumed: what vitkit's config took that the weights do not record.
        fix: (option, what it does): how to make the check complete.
    """

    reference: str | None = None
    scope: str | None = None
    difference: float | None = None
    compared: tuple[str, ...] = ()
    tolerance: float = PARITY_TOLERANCE
    refused: str | None = None
    note: str | None = None
    assumed: tuple[str, ...] = ()
    fix: tuple[str, str] | None = None

    @property
    def failed(self) -> bool:
        """The reference disagreed: it refused the weights, or its outputs differ by more
        than the tolerance."""
        too_far = self.difference is not None and self.difference > self.tolerance
        return self.refused is not None or too_far

    @property
    def ok(self) -> bool:
        """The source's own model computes what vitkit's does (within the tolerance)."""
        return self.scope == "function" and self.difference is not None and not self.failed

    def line(self, forms: Mapping[str, str] = OPTION_FORMS) -> str:
        """One line saying what was checked against what, and what was not; `forms` write
        the options of the fix (`OPTION_FORMS`, or a command's flags)."""
        if self.refused is not None:
            return f"parity vs {self.reference}: MISMATCH: {self.refused}"
        verdict = "MISMATCH, " if self.failed else "within "
        if self.scope == "function":
            verdict = "MISMATCH, " if self.failed else "ok, "
            text = f"parity vs {self.reference}: {self._measured()}"
        elif self.scope == "mapping":
            text = (
                f"parity: checked the key mapping only, against {self.reference} built from "
                f"vitkit's inferred config: {self._measured()}"
            )
        else:
            text = f"parity{f' vs {self.reference}' if self.reference else ''}: not checked: "
            text += str(self.note)
        if self.scope is not None:
            text += f" ({verdict}tolerance {self.tolerance:.0e})"
            if self.note:
                text += f"; {self.note}"
        if self.assumed:
            text += f"; the weights do not record {_and(self.assumed)}"
            if self.fix is not None:
                option, purpose = self.fix
                text += f": pass {forms.get(option, option + '=')} {purpose}"
        return text

    def _measured(self) -> str:
        what = _and(tuple(dict.fromkeys(self.compared)))
        return f"max |difference| {self.difference:.2e} over the {what} of a random batch of 2"


def check_parity(
    model: VisionTransformer,
    source: str | os.PathLike,
    format: str,
    *,
    arch: str | None = None,
    num_heads: int | None = None,
    hf_config: Any = None,
    tolerance: float = PARITY_TOLERANCE,
) -> Parity:
    """`model` (converted from `source`) beside the source library's own model of `source`.

    Args:
        model: the converted vitkit model.
        source: the weights file or folder it was converted from.
        format: 'timm', 'hf', 'torchvision' or 'jax'.
        arch, num_heads, hf_config: the reading options the conversion was given (`arch`: a
            timm model name, or for torchvision a builder name such as 'vit_b_16').
        tolerance: the largest |difference| accepted.
    """
    checks = {"timm": _timm_parity, "hf": _hf_parity, "torchvision": _tv_parity, "jax": _jax_parity}
    if format not in checks:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(checks)}")
    given = {"arch": arch, "num_heads": num_heads, "hf_config": hf_config}
    given = {k: v for k, v in given.items() if v is not None}
    return dataclasses.replace(checks[format](model, Path(source), given), tolerance=tolerance)


def reading_options(
    source: str | os.PathLike, format: str, *, arch: str | None = None, num_heads: int | None = None
) -> dict[str, Any]:
    """`load_pretrained`'s `arch` and `num_heads` for `source`: a torchvision builder name
    (`arch='vit_b_16'`) gives its head count; without `arch`, a timm name the file records
    (`recorded_name`) that vitkit knows names the architecture."""
    if format == "torchvision" and arch in TORCHVISION_BUILDERS:
        return {"num_heads": num_heads or TORCHVISION_BUILDERS[arch][2]}
    if arch is None and format == "timm":
        name = recorded_name(source)
        arch = name if name in list_models() else None
    return {k: v for k, v in {"arch": arch, "num_heads": num_heads}.items() if v is not None}


# -- the comparison ---------------------------------------------------------------------------


def _compare(model: VisionTransformer, outputs: Outputs, **fields: Any) -> Parity:
    """Both models on a random batch of 2: the largest |difference| over the outputs the
    reference gives ('output': `model(x)`, 'features': the tokens, 'pooled': the pooled
    features)."""
    cfg = model.config
    height, width = model.patch_embed.img_size
    x = torch.randn(2, cfg.in_chans, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = outputs(x)
        features = model.forward_features(x)
        ours = {
            "output": model(x),
            "features": features,
            "pooled": model.forward_head(features, pre_logits=True),
        }
    names = {"output": "logits" if cfg.num_classes else "pooled features",
             "features": "tokens", "pooled": "pooled features"}  # fmt: skip
    for key, value in theirs.items():
        if value.ndim == 3 and ours[key].ndim == 4:  # a Swin's NHWC map, as HF's tokens
            ours[key] = ours[key].flatten(1, 2)  # (B, H * W, C)
        if value.shape != ours[key].shape:
            raise ReferenceMismatch(
                f"its {names[key]} have shape {tuple(value.shape)}, vitkit's "
                f"{tuple(ours[key].shape)}"
            )
    diff = max((ours[k] - v).abs().max().item() for k, v in theirs.items())
    return Parity(difference=diff, compared=tuple(names[k] for k in theirs), **fields)


def _run(model: VisionTransformer, build: Callable[[], Outputs], **fields: Any) -> Parity:
    """`_compare` with the reference `build` makes; its refusal is a mismatch."""
    try:
        return _compare(model, build(), **fields)
    except ReferenceMismatch as err:
        return Parity(refused=str(err), **fields)
    except RuntimeError as err:  # torch's load_state_dict of a generic reference
        reason = " ".join(str(err).split())[:300]
        return Parity(refused=f"that model does not hold these weights ({reason})", **fields)


def _not_installed(library: str, reference: str | None, **fields: Any) -> Parity:
    return Parity(reference=reference, note=f"{library} is not installed ({_INSTALL})", **fields)


def _and(items: tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _created(name: str, kwargs: Mapping[str, Any]) -> str:
    """'timm NAME (depth=2)': the keyword arguments that differ from the name's own sizes."""
    if name not in list_models():
        return f"timm {name}"
    named = get_config(name)
    differ = [
        f"{key}={value}"
        for key, value in kwargs.items()
        if hasattr(named, key) and _size(key, value) != _size(key, getattr(named, key))
    ]
    return f"timm {name}" + (f" ({', '.join(differ)})" if differ else "")


def _size(key: str, value: Any) -> Any:
    return to_2tuple(value, key) if key in ("img_size", "patch_size") else value


# -- timm -------------------------------------------------------------------------------------


def _timm_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    name = given.get("arch") or recorded_name(path)
    info = inspect(path, format="timm")
    stated = {**info.source_options, **given}  # a timm folder's model_args, the options given
    assumed = () if name else _timm_assumed(model.config, stated)
    fields = {"assumed": assumed, "fix": ("arch", "to check against timm") if assumed else None}
    weights = strip_prefix(load_state_dict(info.weights_file), "module.")
    if any(k.startswith("blocks.layers.") for k in weights):  # vitkit encoder='torch' weights
        weights = torch_to_native_state_dict(weights)
    try:
        import timm
    except ImportError:
        return _not_installed("timm", name and f"timm {name}", **fields)
    if name and timm.is_model(name):
        kwargs = {**folder_model_args(path), **_timm_sizes(model.config)}
        reference = _created(name, kwargs)

        def build() -> Outputs:
            named = timm.create_model(name, pretrained=False, **kwargs)
            strict_load(named, weights)
            return timm_outputs(named)

        return _run(model, build, reference=reference, scope="function", **fields)
    if name:
        fields["note"] = f"timm {timm.__version__} does not know {name}"
    return _run(
        model,
        lambda: timm_outputs(source_model("timm", model.config, weights)),
        reference="timm's VisionTransformer",
        scope="mapping",
        **fields,
    )


def _timm_sizes(config: ViTConfig | SwinConfig) -> dict[str, Any]:
    """The sizes of a timm model the weights show and that can differ from its name's
    without another function: depth, classes, channels and resolution (a Swin's depths,
    heads and windows)."""
    if isinstance(config, SwinConfig):
        return {"embed_dim": config.embed_dim, "depths": config.depths,
                "num_heads": config.num_heads,
                "num_classes": config.num_classes, "in_chans": config.in_chans,
                "img_size": config.img_size, "window_size": config.windows}  # fmt: skip
    return {"depth": config.depth, "num_classes": config.num_classes,
            "in_chans": config.in_chans, "img_size": config.img_size}  # fmt: skip


def _timm_assumed(config: ViTConfig, stated: Mapping[str, Any]) -> tuple[str, ...]:
    """What `from_timm` took without a name that the weights do not record."""
    assumed = []
    if "act_layer" not in stated and config.mlp_layer == "mlp":
        act = _ACTIVATIONS.get(config.act_layer, config.act_layer)
        assumed.append(f"the activation ({act} assumed)")
    if "norm_eps" not in stated:
        assumed.append(f"the norm epsilon ({config.norm_eps:g} assumed)")
    if "res_post_norm" not in stated:
        order = "post-norm" if config.res_post_norm else "pre-norm"
        assumed.append(f"the block order ({order} assumed)")
    if "num_heads" not in stated:
        assumed.append(f"the head count ({config.num_heads} assumed)")
    if "global_pool" not in stated and config.global_pool != "map":
        assumed.append(f"the pooling ('{config.global_pool}' assumed)")
    return tuple(assumed)


# -- JAX: timm's model of the name, the file read by timm's npz loader --------------------------


def _jax_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    name = given.get("arch")
    config = model.config
    fields: dict[str, Any] = {}
    if name is None:
        act = _ACTIVATIONS.get(config.act_layer, config.act_layer)
        fields = {"assumed": (f"the activation ({act} assumed)",),
                  "fix": ("arch", "to check against timm")}  # fmt: skip
    try:
        import timm
        from timm.models.vision_transformer import _load_weights
    except ImportError:
        return _not_installed("timm", name and f"timm {name}", **fields)

    def read(load: Callable[[], nn.Module], what: str) -> Outputs:
        try:
            return timm_outputs(load())
        except (KeyError, ValueError, RuntimeError, AssertionError) as err:
            raise ReferenceMismatch(
                f"timm's npz loader cannot read the file into {what} ({err})"
            ) from None

    if name is not None and not timm.is_model(name):
        fields["note"] = f"timm {timm.__version__} does not know {name}"
    elif name is not None:
        kwargs = {**_timm_sizes(config), **_jax_sizes(config, name)}

        def named() -> nn.Module:
            built = timm.create_model(name, pretrained=False, **kwargs)
            _load_weights(built, str(path))
            return built

        reference = f"{_created(name, kwargs)}, the file read by timm's npz loader"
        return _run(
            model, lambda: read(named, f"timm's {name}"), reference=reference, scope="function"
        )
    return _run(
        model,
        lambda: read(lambda: source_model("jax", config, path), "that model"),
        reference="timm's npz loader and VisionTransformer",
        scope="mapping",
        **fields,
    )


def _jax_sizes(config: ViTConfig, name: str) -> dict[str, Any]:
    """What the arrays record beyond `_timm_sizes`, which timm takes from them too: width,
    heads, patch size, MLP width and the class token's position."""
    sizes = {"embed_dim": config.embed_dim, "num_heads": config.num_heads,
             "patch_size": config.patch_size, "no_embed_class": config.no_embed_class}  # fmt: skip
    hidden = round(config.embed_dim * config.mlp_ratio)
    if int(config.embed_dim * get_config(name).mlp_ratio) != hidden:
        ratio = hidden / config.embed_dim
        if int(config.embed_dim * ratio) != hidden:  # float rounding below `hidden`
            ratio = (hidden + 0.5) / config.embed_dim
        sizes["mlp_ratio"] = ratio
    return sizes


# -- torchvision ------------------------------------------------------------------------------


def _tv_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    config = model.config
    if isinstance(config, SwinConfig):
        return _tv_swin_parity(model, path)
    arch = given.get("arch")
    builder = arch if arch in TORCHVISION_BUILDERS else torchvision_builder(config)
    fields: dict[str, Any] = {"assumed": ()}
    if builder is None and "num_heads" not in given and arch is None:  # no name gave them
        fields = {"assumed": (f"the head count ({config.num_heads} assumed)",),
                  "fix": ("num_heads", "if it differs")}  # fmt: skip
    if config.conv_stem:
        stem = "the conv stem's strides, BatchNorm eps and activation (2, 1e-5, ReLU assumed)"
        fields["assumed"] += (stem,)
    try:
        import torchvision
    except ImportError:
        return _not_installed("torchvision", builder and f"torchvision {builder}", **fields)
    weights = load_state_dict(weights_file(path))
    if builder is not None:
        kwargs = {"num_classes": config.num_classes, "image_size": config.img_size}
        shown = [f"{k}={v}" for k, v in kwargs.items() if v != _TV_DEFAULTS[k]]
        reference = f"torchvision {builder}" + (f" ({', '.join(shown)})" if shown else "")

        def build() -> nn.Module:
            return getattr(torchvision.models, builder)(weights=None, **kwargs)
    else:
        reference = "torchvision's VisionTransformer"

        def build() -> nn.Module:
            return torchvision.models.VisionTransformer(**torchvision_kwargs(config))

    def outputs() -> Outputs:
        built = build().eval()
        strict_load(built, weights)
        return lambda x: {"output": built(x)}

    return _run(model, outputs, reference=reference, scope="function", **fields)


def _tv_swin_parity(model: SwinTransformer, path: Path) -> Parity:
    """torchvision's SwinTransformer of the weights' sizes (the builder's name where they are
    one's), loaded strictly, at the converted model's image size."""
    builder = torchvision_swin_builder(model.config)
    reference = f"torchvision {builder or 'SwinTransformer'}"
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return _not_installed("torchvision", reference)
    weights = load_state_dict(weights_file(path))

    def outputs() -> Outputs:
        built = torchvision_swin_model(model.config).eval()
        strict_load(built, weights)
        return lambda x: {"output": built(x)}

    return _run(model, outputs, reference=reference, scope="function")


# -- Hugging Face -----------------------------------------------------------------------------


def _hf_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    info = inspect(path, format="hf")
    stated = given.get("hf_config") or info.source_options.get("config")
    config = model.config
    fields: dict[str, Any] = {}
    if stated is None:
        act = _ACTIVATIONS.get(config.act_layer, config.act_layer)
        assumed = [f"the activation ({act} assumed)", f"the norm epsilon ({config.norm_eps:g} "
                   "assumed)"]  # fmt: skip
        if "num_heads" not in given:
            assumed.append(f"the head count ({config.num_heads} assumed)")
        fields = {"assumed": tuple(assumed), "fix": ("hf_config", "to check against transformers")}
    try:
        import transformers
    except ImportError:
        return _not_installed("transformers", None, **fields)
    weights = load_state_dict(info.weights_file)
    with quiet_transformers(transformers):
        if stated is None and isinstance(config, SwinConfig):  # transformers' Swin: a config
            return Parity(note="transformers' Swin is built from its config.json", **fields)
        if stated is None:
            inner = source_model("hf", config, weights).inner
            return _run(
                model,
                lambda: hf_outputs(inner),
                reference=f"transformers' {type(inner).__name__}",
                scope="mapping",
                **fields,
            )
        hub = hf_config_dict(stated)
        name = hf_class(hub, transformers)
        folder = path if path.is_dir() and "hf_config" not in given else None
        return _run(
            model,
            lambda: hf_outputs(hf_pretrained(transformers, name, hub, folder, weights)),
            reference=f"transformers {name}",
            scope="function",
        )
