"""`inspect`: what a weights file or folder is, read once.

One call opens the file (and its folder's `config.json` / `preprocessor_config.json`) and
answers everything a caller decides on: the format (a vitkit checkpoint, a timm CNN saved by
vitkit, timm / Hugging Face / torchvision state dicts, JAX `.npz`, an ONNX model), the model
config, the data config, the class names and the tensor shapes, or why the config cannot be
told (a `CheckpointError`, e.g. a `MissingOptionError` naming what to pass). Loaders
(`load`, `load_any`, `load_pretrained`) and the callers that pick one (the teacher, the
commands) act on this answer instead of probing the file function by function.

Nothing is allocated for the tensors: shapes come from the safetensors header, the `.npy`
headers of an `.npz`, or a memory-mapped `torch.load`; the config of converted weights is
inferred by running the converter on tensors of the meta device. Untrusted metadata (a saved
config, a folder's `model_args`) is checked against those shapes here, before any model is
built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.data_config import DataConfig
from ..model import check_implemented, list_models
from .checkpoint import (
    CONFIG_KEY,
    CheckpointError,
    check_class_names,
    check_header,
    extra_metadata,
    is_npz_file,
    is_safetensors_file,
    load_state_dict,
    npz_shapes,
    safetensors_header,
    saved_config,
    saved_data_config,
    weights_file,
)
from .cnn import TIMM_KEY, parse_spec
from .detect import CONVERTERS, FORMATS, detect_format
from .families import family_named, weights_family
from .hub_cache import resolve_weights
from .preprocessing import (
    LIBRARIES,
    hf_data_config,
    read_json_object,
    timm_data_config,
)

log = logging.getLogger(__name__)

# The ONNX metadata key of the data config, as vitkit's export writes it.
ONNX_DATA_CONFIG = "vitkit_data_config"


@dataclass(frozen=True, kw_only=True)
class WeightsInfo:
    """What `inspect` found.

    Args:
        path: the file or folder as given.
        format: 'vitkit', 'timm-cnn' (a timm CNN: saved by vitkit, or a timm folder of one),
            'timm', 'hf', 'torchvision', 'jax' or 'onnx'.
        weights_file: the file holding the tensors (a folder's `model.safetensors`, ...).
        folder: None for a file; 'timm' or 'hf' for a folder with that library's
            `config.json`, 'plain' for a folder without one.
        shapes: key -> shape of every tensor, as the file stores them.
        config: the model's config (its family's config class), saved or inferred; None
            when it cannot be told (`error` says why) or the model is no vitkit family's.
        data_config: the preparation the source states (saved, `pretrained_cfg`,
            `preprocessor_config.json`, ONNX metadata); None when it states none.
        class_names: the names the source gives its classes, if any.
        meta: a vitkit checkpoint's extra metadata.
        cnn: a timm CNN's name, classes and channels (and timm `model_args`).
        error: why `config` is None for weights that should have one.
        source_options: what the folder's `config.json` tells the converter (the Hugging
            Face config, a timm folder's `model_args` and architecture).
        tensors: the tensors already mapped (pickled files), for the loader.
    """

    path: Path
    format: str
    weights_file: Path
    folder: str | None = None
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    config: Any = None
    data_config: DataConfig | None = None
    class_names: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    cnn: Mapping[str, Any] | None = None
    error: CheckpointError | None = None
    source_options: Mapping[str, Any] = field(default_factory=dict)
    tensors: Mapping[str, Tensor] | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """How messages name it: 'a vitkit checkpoint', 'a timm folder', 'a torchvision state
        dict (.pth)', ..."""
        if self.format == "vitkit":
            return "a vitkit checkpoint"
        if self.format == "onnx":
            return "an ONNX model"
        if self.format == "timm-cnn":
            where = "a timm folder" if self.folder else "a vitkit checkpoint"
            return f"{where} of the timm CNN {self.cnn['name']}"
        library = LIBRARIES[self.format]
        if self.folder in ("timm", "hf"):
            return f"a {LIBRARIES[self.folder]} folder"
        if self.folder == "plain":
            return f"a folder of {library} weights"
        if self.format == "jax":
            return "a JAX .npz checkpoint"
        suffix = self.weights_file.suffix or "no suffix"
        return f"a {library} state dict ({suffix})"

    @property
    def num_classes(self) -> int | None:
        """The classifier's outputs (0: no head), when known."""
        if self.config is not None:
            return self.config.num_classes
        return self.cnn["num_classes"] if self.cnn else None

    def require_config(self) -> Any:
        """`config`, else the error that says why there is none."""
        if self.config is not None:
            return self.config
        if self.error is not None:
            raise self.error
        raise CheckpointError(f"{self.path} is {self.kind}, not a model of a vitkit family")


def inspect(
    source: str | os.PathLike,
    *,
    format: str = "auto",
    num_heads: int | None = None,
    arch: str | None = None,
    hf_config: Any = None,
    overrides: Mapping[str, Any] | None = None,
) -> WeightsInfo:
    """What the weights at `source` (a file or a model folder) are; see `WeightsInfo`.

    Args:
        source: a `.safetensors` / `.pth` / `.bin` / `.npz` / `.onnx` file or a Hugging Face
            or timm model folder; or a Hub id (`timm/NAME`, `hf-hub:ORG/NAME`, `ORG/NAME`,
            `local-dir:PATH`) read from the local Hugging Face cache (`hub_cache.py`; a path
            that exists wins).
        format: 'auto' (from the file and its key names) or one of `FORMATS`.
        num_heads, arch, hf_config: what the weights do not record (the converters'
            arguments; `hf_config` is a Hugging Face config.json, its path or a dict).
        overrides: config fields the config is inferred with.

    Raises a CheckpointError for a path that does not exist or a file that cannot be read;
    weights whose config cannot be inferred are answered with `error` set.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected 'auto' or one of {FORMATS}")
    path = resolve_weights(source)  # a Hub id: its folder in the local cache
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    folder, hub = _folder(path)
    for name in (arch, hub.get("architecture")):
        if isinstance(name, str):
            check_implemented(name)  # a timm name vitkit refuses, with the reason
    file = weights_file(path)
    if file.suffix == ".onnx":
        return _onnx_info(path, file)
    found = {"path": path, "weights_file": file, "folder": folder}
    tensors = None
    if format in ("auto", "jax") and (file.suffix == ".npz" or is_npz_file(file)):
        shapes, format = npz_shapes(file), "jax"
    elif file.suffix == ".safetensors" or is_safetensors_file(file):
        metadata, shapes = safetensors_header(file)
        if format in ("auto", "vitkit") and CONFIG_KEY in metadata:
            return _vitkit_info(found, metadata, shapes)
        if format == "auto" and TIMM_KEY in metadata:
            return _saved_cnn_info(found, metadata, shapes)
    else:
        tensors = load_state_dict(file, mmap=True)
        shapes = {key: tuple(value.shape) for key, value in tensors.items()}
    if format == "auto":
        format = _format_of(shapes, hub, path)
    if format == "timm-cnn":
        return _folder_cnn_info(found, hub, shapes)
    reading = _source_options(format, folder, hub, path, num_heads, arch, hf_config)
    config, error = _infer(format, shapes, {**reading, **(overrides or {})})
    return WeightsInfo(
        **found,
        format=format,
        shapes=shapes,
        config=config,
        error=error,
        data_config=_stated_data_config(path, folder, hub, config),
        class_names=_folder_class_names(hub, config, path),
        source_options=reading,
        tensors=tensors,
    )


def _folder(path: Path) -> tuple[str | None, dict[str, Any]]:
    """(what kind of model folder `path` is, its `config.json`): 'timm' (`architecture` or
    `pretrained_cfg`), 'hf', 'plain' (no config.json) or, for a file, None."""
    if not path.is_dir():
        return None, {}
    config = path / "config.json"
    if not config.is_file():
        return "plain", {}
    hub = read_json_object(config)
    return ("timm" if "architecture" in hub or "pretrained_cfg" in hub else "hf"), hub


def _format_of(shapes: Mapping[str, tuple], hub: Mapping[str, Any], path: Path) -> str:
    """The library of a state dict, from its keys; a timm folder whose architecture is no ViT
    holds a timm CNN."""
    try:
        return detect_format(shapes)
    except CheckpointError:
        if isinstance(hub.get("architecture"), str):  # no family's keys: a CNN
            return "timm-cnn"
        keys = ", ".join(list(shapes)[:4])
        raise CheckpointError(
            f"{path} has no vitkit config in its metadata and its keys ({keys}, ...) are none "
            f"of {', '.join(FORMATS)}: cannot tell the checkpoint format; pass format= if it is "
            "one of them"
        ) from None


def _vitkit_info(
    found: dict[str, Any], metadata: Mapping[str, str], shapes: Mapping[str, tuple]
) -> WeightsInfo:
    """A checkpoint `save` wrote: its config, checked against the tensors, and its meta."""
    file = found["weights_file"]
    config = saved_config(metadata, file)
    check_header(config, shapes, file, weights_family(config).saved_shapes_problem)
    meta = extra_metadata(metadata, file)
    check_class_names(meta, config.num_classes, file)
    names = meta.get("class_names")
    return WeightsInfo(
        **found,
        format="vitkit",
        shapes=shapes,
        config=config,
        data_config=saved_data_config(meta, config, str(file)),
        class_names=tuple(names) if names else None,
        meta=meta,
    )


def _saved_cnn_info(
    found: dict[str, Any], metadata: Mapping[str, str], shapes: Mapping[str, tuple]
) -> WeightsInfo:
    """A timm CNN that `save` wrote (`--model timm:NAME`): its name, classes and channels."""
    file = found["weights_file"]
    try:
        cnn = parse_spec(metadata[TIMM_KEY], str(file))
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    meta = extra_metadata(metadata, file)  # class names: checked by the loader, with timm
    names = meta.get("class_names")
    data_config = None
    if "data_config" in meta:
        try:
            data_config = DataConfig.from_dict(meta["data_config"], f"{file}: data_config")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    return WeightsInfo(
        **found,
        format="timm-cnn",
        shapes=shapes,
        cnn=cnn,
        data_config=data_config,
        class_names=tuple(names) if names else None,
        meta=meta,
    )


def _folder_cnn_info(
    found: dict[str, Any], hub: Mapping[str, Any], shapes: Mapping[str, tuple]
) -> WeightsInfo:
    """A timm folder of a CNN (`save_for_hf` of a ResNet, ...)."""
    model_args = hub.get("model_args") if isinstance(hub.get("model_args"), Mapping) else {}
    cnn = {
        "name": hub["architecture"],
        "num_classes": hub.get("num_classes", 1000),
        "in_chans": model_args.get("in_chans", 3),
        "model_args": {k: v for k, v in model_args.items() if k not in ("in_chans", "num_classes")},
    }
    if not isinstance(cnn["num_classes"], int) or not isinstance(cnn["in_chans"], int):
        raise CheckpointError(f"{found['path']}/config.json has invalid num_classes / in_chans")
    path = found["path"]
    return WeightsInfo(
        **found,
        format="timm-cnn",
        shapes=shapes,
        cnn=cnn,
        data_config=_stated_data_config(path, found["folder"], hub, None),
        class_names=_folder_class_names(hub, None, path),
    )


def _onnx_info(path: Path, file: Path) -> WeightsInfo:
    """An ONNX model: its data config from vitkit's metadata, when it has one (the graph is
    read by onnx, the `onnx` extra)."""
    import onnx

    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as err:  # onnx raises its own types for bad files
        raise CheckpointError(f"{file} is not a readable ONNX model ({err})") from None
    props = {p.key: p.value for p in model.metadata_props}
    data_config = None
    if ONNX_DATA_CONFIG in props:
        try:
            values = json.loads(props[ONNX_DATA_CONFIG])
            data_config = DataConfig.from_dict(values, f"{file}: {ONNX_DATA_CONFIG}")
        except (json.JSONDecodeError, RecursionError, ValueError) as err:
            raise CheckpointError(f"{file}: unusable {ONNX_DATA_CONFIG} ({err})") from None
    return WeightsInfo(path=path, format="onnx", weights_file=file, data_config=data_config)


def _source_options(
    format: str,
    folder: str | None,
    hub: Mapping[str, Any],
    path: Path,
    num_heads: int | None,
    arch: str | None,
    hf_config: Any,
) -> dict[str, Any]:
    """The converter's arguments for what the weights do not record: given ones over what the
    folder's config.json says (a Hugging Face config; a timm folder's `model_args`, over its
    architecture's, and that architecture)."""
    options: dict[str, Any] = {}
    if format == "hf" and folder == "hf":
        options["config"] = dict(hub)
    elif format == "timm" and folder == "timm":
        model_args = hub.get("model_args")
        if isinstance(model_args, Mapping):  # as the family its architecture names reads them
            options.update(family_named(hub.get("architecture")).folder_options(model_args))
        if hub.get("architecture") in list_models():
            options["arch"] = hub["architecture"]
    if hf_config is not None:
        options["config"] = hf_config
    if num_heads is not None:
        options["num_heads"] = num_heads
    if arch is not None:
        options["arch"] = arch
    return options


def _infer(
    format: str, shapes: Mapping[str, tuple], options: Mapping[str, Any]
) -> tuple[Any, CheckpointError | None]:
    """The config the converter infers from tensors of these shapes on the meta device (no
    memory), and none with the reason when it cannot."""
    probe = {key: torch.empty(shape, device="meta") for key, shape in shapes.items()}
    try:
        with _quiet():
            return CONVERTERS[format](probe, **converter_options(format, options))[1], None
    except CheckpointError as err:
        return None, err
    except (ValueError, TypeError) as err:  # options the config refuses
        return None, CheckpointError(str(err))


def converter_options(format: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as `format`'s converter takes them: an `arch` gives what the family it names
    says for that format (`WeightsFamily.named_options`); the Hugging Face config goes to the
    'hf' converter only, a timm folder's img_size to the timm one."""
    options = dict(options)
    if "arch" in options:
        options = family_named(options["arch"]).named_options(format, options)
    if format != "hf":
        options.pop("config", None)
    if format not in ("timm", "vitkit"):
        options.pop("folder_img_size", None)  # a timm folder's img_size
    return options


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The converters' notes are for the load, not for this look at the file."""
    logger = logging.getLogger(__package__)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _stated_data_config(
    path: Path, folder: str | None, hub: Mapping[str, Any], config: Any
) -> DataConfig | None:
    """The data config a folder states (beside a file: its folder's): timm's
    `pretrained_cfg` in `config.json`, else a `preprocessor_config.json` (read for the
    model's size and channels: `processor_data_config`)."""
    if folder is None:  # a file: its folder's files, when they describe it
        if not (path.parent / "config.json").is_file():
            return None
        hub = read_json_object(path.parent / "config.json")
        path = path.parent
    if isinstance(hub.get("pretrained_cfg"), Mapping):
        source = f"{path / 'config.json'}: pretrained_cfg"
        return timm_data_config(hub["pretrained_cfg"], source)
    return processor_data_config(path, config) if config is not None else None


def processor_data_config(path: Path, config: Any) -> DataConfig | None:
    """The data config of the Hugging Face `preprocessor_config.json` in folder `path` (or
    beside file `path`) for a model of `config`; None without one."""
    folder = path if path.is_dir() else path.parent
    processor = folder / "preprocessor_config.json"
    if not processor.is_file():
        return None
    return hf_data_config(read_json_object(processor), config, str(processor))


def _folder_class_names(hub: Mapping[str, Any], config: Any, path: Path) -> tuple[str, ...] | None:
    """The class names a folder's config.json gives: timm's `label_names` (top level or in
    `pretrained_cfg`), Hugging Face's `id2label` unless it is the default `LABEL_i`."""
    names = hub.get("label_names")
    cfg = hub.get("pretrained_cfg")
    if names is None and isinstance(cfg, Mapping):
        names = cfg.get("label_names")
    labels = hub.get("id2label")
    if names is None and isinstance(labels, Mapping) and labels:
        try:
            names = [labels[str(i)] for i in range(len(labels))]
        except KeyError:
            raise CheckpointError(f"{path}: id2label is not numbered 0 to N-1") from None
        if names == [f"LABEL_{i}" for i in range(len(names))]:
            names = None
    if names is None:
        return None
    outputs = config.num_classes if config is not None else hub.get("num_classes", 0)
    check_class_names({"class_names": names}, outputs, path)
    return tuple(names)
