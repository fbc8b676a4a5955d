"""The weights registry: one `WeightsFamily` record per model family, registered once, which the
generic weights code (`detect`, `info`, `pretrained`, `loading`, `parity`, the exporters) asks
instead of naming a model class or sniffing a family's keys (as timm's `register_model` with
each family's `checkpoint_filter_fn`).

The rule is weights per family: a family's converters in and out, the key patterns that tell
its weights in each source layout (timm / vitkit, Hugging Face, torchvision, JAX), its checks
and its folder exporters live in its room (`vit/`, `swin/`, `eva/`, `beit/`); the modules at this
package's top know no family. A new family is a new room and one record here. This module and
the rooms are the only places that import the rooms; the ViT's converters are published
through it (`vitkit.convert`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..model import architecture_of, get_config, list_models
from .beit import folders as beit_folders
from .beit import pretrained as beit_pretrained
from .beit import reading as beit_reading
from .checkpoint import saved_shapes_problem
from .eva import folders as eva_folders
from .eva import pretrained as eva_pretrained
from .eva import reading as eva_reading
from .relpos import folders as relpos_folders
from .relpos import pretrained as relpos_pretrained
from .relpos import reading as relpos_reading
from .sam import folders as sam_folders
from .sam import pretrained as sam_pretrained
from .sam import reading as sam_reading
from .swin import folders as swin_folders
from .swin import parity as swin_parity
from .swin import reading as swin_reading
from .vit import folders as vit_folders
from .vit import layout as vit_layout
from .vit import parity as vit_parity
from .vit import pretrained as vit_pretrained
from .vit import reading as vit_reading
from .vit import timm as vit_timm

# The ViT's converters, which `vitkit.convert` publishes (their room is imported here only).
from .vit.hf import from_hf, to_hf, to_hf_config
from .vit.jax import from_jax
from .vit.layout import (
    STANDARD_HEADS,
    check_state_dict,
    default_num_heads,
    expected_shapes,
    infer_config,
)
from .vit.reference import source_model
from .vit.timm import from_timm, timm_kwargs, to_timm
from .vit.torchvision import from_torchvision, torchvision_kwargs

Reader = Callable[..., tuple[dict[str, Tensor], Any]]


def _no_options(*args: Any) -> dict[str, Any]:
    return {}


def _as_given(format: str, options: dict[str, Any]) -> dict[str, Any]:
    return options


def _no_check(config: Any, arch: str, overrides: Mapping[str, Any] | None = None) -> None:
    """A family whose converters check a name against the weights as they read them."""


def _same(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    return state_dict


def _patch_projection(config: Any) -> str:
    return "patch_embed.proj.weight"


def _nothing_assumed(config: Any, stated: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class WeightsFamily:
    """One model family's weights, as the generic weights code asks them.

    Args:
        architectures: the `Architecture` names it serves ('vit'; 'swin', 'swin_cr').
        recognises: source format -> whether a state dict's keys are this family's in that
            layout (`detect_format` asks every family; the first that claims keys reads them).
        readers: source format -> its converter in: (state dict, **reading options) ->
            (vitkit state dict, config). Every reader is given the same options
            (`load_pretrained`'s and `inspect`'s) and drops those it does not read.
        fill: `load_pretrained`'s last step: (`SourceWeights`, the model or None, `Fitting`,
            config overrides) -> the model holding the weights, in eval mode, with its data
            config.
        saved_shapes_problem: (saved config, file shapes) -> how they disagree, or None.
        named_options: (format, reading options with `arch`) -> the options a name of this
            family gives that format's converter.
        folder_options: a timm folder's `model_args` -> its converter's options.
        builders: a source library's names of its models that are no vitkit preset
            (torchvision's builders) -> the reading options each stands for.
        check_arch: (config, arch, overrides) -> refuse a name of other sizes than the weights'
            (`ArchMismatchError`).
        model_reading: (a given model, format) -> the reading options the model states.
        native_keys: a saved state dict -> its keys in the family's native layout.
        name_fields: the config fields a preset name fixes that the weights do not show (a
            recorded name counts only where a saved config keeps them).
        parity: source format -> the family's own parity check (`parity.check_parity`);
            formats not named are checked by the generic checks with `timm_sizes`,
            `timm_assumed` and `reference_model`.
        timm_sizes: config -> the sizes of a timm model the weights show.
        timm_assumed: (config, stated options) -> what a conversion without a name assumed.
        reference_model: (format, config, weights) -> the source library's generic model of
            the config (a check of the key mapping only); None: the family has none.
        timm_reference: how a parity line names the generic timm model of `reference_model`.
        folders: 'hf' / 'timm' -> (model, folder) -> the folder written (`vitkit export`).
        input_conv: config -> the key of the weight that takes the image (timm's
            `pretrained_cfg['first_conv']`), which `adapt_input_conv` fits to another number
            of channels (`weights/channels.py`).
        read_by_name: the formats in which a name of this family (`arch=`, a timm folder's
            architecture) reads keys no family claims (its weights can look like a plain
            ViT's: an EVA's without LayerScale nor EVA's attention biases).
    """

    architectures: tuple[str, ...]
    recognises: Mapping[str, Callable[[Sequence[str]], bool]]
    readers: Mapping[str, Reader]
    fill: Callable[..., nn.Module]
    saved_shapes_problem: Callable[[Any, Mapping[str, Sequence[int]]], str | None] = (
        saved_shapes_problem
    )
    named_options: Callable[[str, dict[str, Any]], dict[str, Any]] = _as_given
    folder_options: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_options
    builders: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    check_arch: Callable[..., None] = _no_check
    model_reading: Callable[[nn.Module, str], dict[str, Any]] = _no_options
    native_keys: Callable[[dict[str, Tensor]], dict[str, Tensor]] = _same
    name_fields: tuple[str, ...] = ()
    parity: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    timm_sizes: Callable[[Any], dict[str, Any]] = _no_options
    timm_assumed: Callable[[Any, Mapping[str, Any]], tuple[str, ...]] = _nothing_assumed
    reference_model: Callable[[str, Any, Any], nn.Module] | None = None
    timm_reference: str = ""
    folders: Mapping[str, Callable[[nn.Module, Any], Path]] = field(default_factory=dict)
    read_by_name: tuple[str, ...] = ()
    input_conv: Callable[[Any], str] = _patch_projection


VIT = WeightsFamily(
    architectures=("vit",),
    recognises={
        "timm": vit_reading.timm_keys,
        "hf": vit_reading.hf_keys,
        "torchvision": vit_reading.torchvision_keys,
        "jax": vit_reading.jax_keys,
    },
    readers={
        "timm": vit_reading.read_timm,
        "hf": vit_reading.read_hf,
        "torchvision": vit_reading.read_torchvision,
        "jax": vit_reading.read_jax,
    },
    fill=vit_pretrained.fill_vit,
    saved_shapes_problem=vit_layout.saved_shapes_problem,
    named_options=vit_reading.named_options,
    folder_options=vit_reading.folder_options,
    builders=vit_reading.builders(),
    check_arch=vit_timm.check_arch,
    model_reading=vit_reading.model_reading,
    native_keys=vit_reading.native_keys,
    name_fields=tuple(f for f in vit_timm.ARCH_FIELDS if not f.startswith("dynamic_")),
    parity={"torchvision": vit_parity.torchvision_parity, "jax": vit_parity.jax_parity},
    timm_sizes=vit_parity.timm_sizes,
    timm_assumed=vit_parity.timm_assumed,
    reference_model=source_model,
    timm_reference="timm's VisionTransformer",
    folders={"hf": vit_folders.save_hf_folder, "timm": vit_folders.save_timm_folder},
    input_conv=vit_layout.input_conv,
)

SWIN = WeightsFamily(
    architectures=("swin", "swin_cr"),
    recognises={
        "timm": swin_reading.timm_keys,
        "hf": swin_reading.hf_keys,
        "torchvision": swin_reading.torchvision_keys,
    },
    readers={
        "timm": swin_reading.read_timm,
        "hf": swin_reading.read_hf,
        "torchvision": swin_reading.read_torchvision,
    },
    fill=swin_reading.fill,
    folder_options=swin_reading.folder_options,
    builders=swin_reading.builders(),
    parity={"torchvision": swin_parity.torchvision_parity},
    timm_sizes=swin_parity.timm_sizes,
    folders={"hf": swin_folders.save_hf_swin_folder, "timm": swin_folders.save_timm_swin_folder},
)

EVA = WeightsFamily(
    architectures=("eva",),
    recognises={"timm": eva_reading.timm_keys, "hf": eva_reading.hf_keys},
    readers={"timm": eva_reading.read_timm, "hf": eva_reading.read_hf},
    fill=eva_pretrained.fill_eva,
    folder_options=eva_reading.folder_options,
    timm_sizes=eva_reading.timm_sizes,
    folders={"hf": eva_folders.refuse_hf_folder, "timm": eva_folders.refuse_timm_folder},
    read_by_name=("timm",),
)

BEIT = WeightsFamily(
    architectures=("beit",),
    recognises={"timm": beit_reading.timm_keys, "hf": beit_reading.hf_keys},
    readers={"timm": beit_reading.read_timm, "hf": beit_reading.read_hf},
    fill=beit_pretrained.fill_beit,
    folder_options=beit_reading.folder_options,
    timm_sizes=beit_reading.timm_sizes,
    folders={"hf": beit_folders.refuse_hf_folder, "timm": beit_folders.save_timm_beit_folder},
)

SAM = WeightsFamily(
    architectures=("sam",),
    recognises={"timm": sam_reading.timm_keys},
    readers={"timm": sam_reading.read_timm},
    fill=sam_pretrained.fill_sam,
    folder_options=sam_reading.folder_options,
    timm_sizes=sam_reading.timm_sizes,
    folders={"hf": sam_folders.refuse_hf_folder, "timm": sam_folders.refuse_timm_folder},
)

RELPOS = WeightsFamily(
    architectures=("relpos",),
    recognises={"timm": relpos_reading.timm_keys},
    readers={"timm": relpos_reading.read_timm},
    fill=relpos_pretrained.fill_relpos,
    folder_options=relpos_reading.folder_options,
    timm_sizes=relpos_reading.timm_sizes,
    folders={"hf": relpos_folders.refuse_hf_folder, "timm": relpos_folders.refuse_timm_folder},
)

_FAMILIES: list[WeightsFamily] = []
# The family of last resort: keys no other family claims go to its readers, whose refusals
# say what the keys lack, and a name no family owns to its options (the ViT, whose layout is
# timm's `vision_transformer.py`).
_DEFAULT = VIT


def register(family: WeightsFamily) -> None:
    """Add a family; an architecture served twice is refused."""
    taken = {name for known in _FAMILIES for name in known.architectures}
    if taken & set(family.architectures):
        raise ValueError(f"weights of {sorted(taken & set(family.architectures))} are registered")
    _FAMILIES.append(family)


for _family in (SWIN, EVA, BEIT, SAM, RELPOS, VIT):  # the default last: it claims any keys
    register(_family)


def weights_family(model_or_config: Any) -> WeightsFamily:
    """The record of a model's or a config's family (`vitkit.model.architecture_of`)."""
    name = architecture_of(model_or_config).name
    for family in _FAMILIES:
        if name in family.architectures:
            return family
    raise ValueError(f"no weights family serves the {name!r} architecture")


def recognised(format: str, keys: Sequence[str]) -> bool:
    """Whether any family's weights have `keys` in `format`'s layout."""
    return any(f.recognises.get(format, _never)(keys) for f in _FAMILIES)


def _never(keys: Sequence[str]) -> bool:
    return False


def reading_family(format: str, keys: Sequence[str], arch: Any = None) -> WeightsFamily:
    """The first family other than the default that claims `keys` in `format`'s layout; else
    the family `arch` names where it reads such keys by name (`read_by_name`); else the
    default."""
    for family in _FAMILIES:
        if family is _DEFAULT:
            continue
        if format in family.readers and family.recognises.get(format, _never)(keys):
            return family
    named = family_named(arch)
    if format in named.read_by_name:
        return named
    return _DEFAULT


@functools.cache
def reader(format: str) -> Reader:
    """`format`'s converter for every family: the one of the family its keys are (one
    converter per format, whatever family the weights are)."""
    layout = "timm" if format == "vitkit" else format

    def read(state_dict: Mapping[str, Any], **options: Any) -> tuple[dict[str, Tensor], Any]:
        family = reading_family(layout, list(state_dict), options.get("arch"))
        return family.readers[layout](state_dict, **options)

    read.__name__ = read.__qualname__ = f"read_{layout}"
    read.__doc__ = f"The {layout!r} converter of the family whose keys the weights have."
    return read


def family_named(arch: Any) -> WeightsFamily:
    """The family whose model `arch` names (a vitkit preset or a source library's builder),
    else the default."""
    if isinstance(arch, str):
        if arch in list_models():
            return weights_family(get_config(arch))
        for family in _FAMILIES:
            if arch in family.builders:
                return family
    return _DEFAULT


def check_arch(config: Any, arch: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Refuse `arch` (a model name) for weights of `config` when its sizes differ: an
    `ArchMismatchError` naming them (a family whose converters check the name as they read
    the weights refuses it there)."""
    weights_family(config).check_arch(config, arch, overrides)


__all__ = [
    "STANDARD_HEADS",
    "WeightsFamily",
    "check_arch",
    "check_state_dict",
    "default_num_heads",
    "expected_shapes",
    "family_named",
    "from_hf",
    "from_jax",
    "from_timm",
    "from_torchvision",
    "infer_config",
    "reader",
    "reading_family",
    "recognised",
    "register",
    "source_model",
    "timm_kwargs",
    "to_hf",
    "to_hf_config",
    "to_timm",
    "torchvision_kwargs",
    "weights_family",
]
