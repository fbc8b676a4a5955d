"""Safe checkpoints: safetensors with the model config in the metadata, written atomically.

A `.safetensors` file holds tensors only, so loading it runs no code. `.pth` / `.bin` files are
read with `torch.load(weights_only=True)`, which refuses any pickle that would build arbitrary
objects. Every write goes to a temporary file in the same folder, is fsynced and then renamed
over the target, so a crash mid-save leaves the previous file intact.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, safe_open
from safetensors.torch import save as serialize_safetensors
from torch import Tensor, nn

from ..data.data_config import DataConfig
from ..data.datasets import TEST_FRACTION, VAL_FRACTION
from ..files import atomic_write
from ..model import architecture_of, architectures, build_model, get_architecture
from ..model.layers.patch_embed import to_2tuple
from ..options import (
    FRACTION,
    NON_NEGATIVE,
    PROBABILITY,
    Options,
    keyword_forms,
    option,
    option_names,
)
from .cnn import TIMM_KEY, timm_metadata

log = logging.getLogger(__name__)

CONFIG_KEY = "vitkit_config"
META_KEY = "vitkit_meta"
# The architecture record (`vitkit.model.get_architecture`) of a file's config: 'vit', 'swin',
# 'swin_cr'; files written before every family recorded it are ViTs.
ARCH_KEY = "vitkit_architecture"
_UNRECORDED_ARCH = "vit"


# The weights file of a Hugging Face `save_pretrained` / Hub folder (timm's Hub folders too),
# in order of preference.
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, with the reason and the fix."""


@dataclass(frozen=True, kw_only=True)
class WeightsReading(Options):
    """What `load_pretrained` takes, besides the model options, for weights that do not record
    their architecture: the schema of the hints that name them (`MissingOptionError`)."""

    arch: str | None = option(
        None, "the timm model name of the weights", metavar="'<timm model name>'"
    )
    hf_config: str | None = option(None, "a Hugging Face config.json", metavar="PATH")


# How a hint writes each option of the Python API, every family's model options among them (a
# command line writes its own flags).
OPTION_FORMS = keyword_forms(WeightsReading, *(arch.config_class for arch in architectures()))


@dataclass(frozen=True, kw_only=True)
class RunMeta(Options):
    """What a checkpoint records beside its model config (`save(meta=...)`): its classes, how
    its inputs are prepared, what it was trained on and how that data was split (so that
    evaluation finds the same test part), and which epoch wrote it. Weights from elsewhere
    record little: an absent key has its default here, stated once. A checkpoint may hold
    other keys (`save` takes any); `read` leaves them to their readers."""

    NOUN = "metadata key"

    class_names: tuple[str, ...] | None = option(None, "the label of each output")
    data_config: dict[str, Any] | None = option(
        None, "how its inputs are prepared (a `DataConfig` as a dict)"
    )
    mean: tuple[float, ...] | None = option(
        None, "the training data's per-channel mean (files from before data_config)"
    )
    std: tuple[float, ...] | None = option(
        None, "the training data's per-channel std (files from before data_config)"
    )
    data: str | None = option(None, "the training data, as `load_data` takes it")
    image_column: str | None = option(None, "the training data's image column (a table's)")
    label_column: str | None = option(None, "the training data's label column (a table's)")
    model_name: str | None = option(None, "the registered model (or timm name) it is")
    split_seed: int = option(0, "the seed of the training run's split", range=NON_NEGATIVE)
    val_fraction: float = option(
        VAL_FRACTION, "the share of the data held out for validation", range=FRACTION
    )
    test_fraction: float = option(
        TEST_FRACTION, "the share held out for testing (data without a test set)", range=FRACTION
    )
    epoch: int | None = option(None, "the epoch that wrote it", range=NON_NEGATIVE)
    val_acc1: float | None = option(None, "its validation top-1 then")
    ema: bool = option(False, "the weights are the run's exponential moving average")
    multi_label: bool = option(
        False, "one-vs-rest: each class's sigmoid says whether the image is of it"
    )
    threshold: float = option(
        0.5, "a multi-label model's labels are those whose sigmoid reaches it", range=PROBABILITY
    )
    val_map: float | None = option(None, "a multi-label model's validation mAP then")

    @classmethod
    def read(cls, meta: Mapping[str, Any], source: str) -> RunMeta:
        """The keys of a checkpoint's `meta` that this schema knows, checked (a
        CheckpointError naming `source` and the key); the absent ones take their default."""
        known = option_names(cls)
        try:
            return cls(**{key: value for key, value in meta.items() if key in known})
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{source} has invalid metadata: {err}") from None

    def split(self) -> dict[str, Any]:
        """The training run's split, as `load_data` takes it."""
        return {
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
            "seed": self.split_seed,
        }

    def columns(self, data: str) -> dict[str, str | None]:
        """The image and label columns the run read, for `data` when it is the training data
        (other data finds its own)."""
        same = data == self.data
        return {
            "image_column": self.image_column if same else None,
            "label_column": self.label_column if same else None,
        }


class MissingOptionError(CheckpointError):
    """Weights that do not record something only the caller can give.

    `what` says what is missing; `alternatives` are the ways to give it, each a tuple of
    keyword arguments that must all be passed (`option` is the first of the first). The
    message writes them as Python (`num_heads=N`); a command line writes its own flags
    (`hint(forms)`)."""

    def __init__(self, what: str, *alternatives: tuple[str, ...]) -> None:
        self.what = what
        self.alternatives = alternatives
        super().__init__(f"{what}; pass {self.hint(OPTION_FORMS)}")

    @property
    def option(self) -> str:
        return self.alternatives[0][0]

    def hint(self, forms: Mapping[str, str]) -> str | None:
        """The alternatives all of whose options `forms` can write ('A or B and C'), joined
        by ' or '; None when there is none."""
        usable = [alt for alt in self.alternatives if all(name in forms for name in alt)]
        if not usable:
            return None
        return " or ".join(" and ".join(forms[name] for name in alt) for alt in usable)


class ArchMismatchError(CheckpointError):
    """An architecture name (`arch=`) that the weights are not: `differences` names the
    sizes that differ, theirs first."""

    def __init__(self, arch: str, differences: str) -> None:
        self.arch = arch
        self.differences = differences
        super().__init__(
            f"the weights are not {arch!r}: they have {differences}; pass the architecture of "
            "the weights as arch=, or none"
        )


def save(model: nn.Module, path: str | os.PathLike, meta: dict[str, Any] | None = None) -> None:
    """Save weights as safetensors, with `model.config` and `meta` (e.g. class names) as JSON;
    the model's `data_config` (how its inputs are prepared) goes into `meta` unless it has one.

    `load(path)` rebuilds the model from the file alone.
    """
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    timm_spec = timm_metadata(model)  # a timm CNN (`--model timm:NAME`)
    if timm_spec:
        metadata = {TIMM_KEY: timm_spec}
    else:
        config = model.config
        metadata = {
            CONFIG_KEY: json.dumps(config.to_dict()),
            ARCH_KEY: architecture_of(config).name,
        }
    data_config = getattr(model, "data_config", None)
    if data_config is not None and "data_config" not in (meta or {}):
        meta = {**(meta or {}), "data_config": data_config.to_dict()}
    if meta is not None:
        metadata[META_KEY] = json.dumps(meta)
    data = serialize_safetensors(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(data))


def safetensors_header(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, tuple]]:
    """(metadata, key -> shape) of a safetensors file, read from its header alone: nothing is
    allocated for the tensors."""
    path = _existing(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as err:  # safetensors raises several types for bad files
        raise CheckpointError(_invalid_safetensors(path, err)) from None
    return metadata, shapes


def _invalid_safetensors(path: Path, err: BaseException) -> str:
    return (
        f"{path} is not a valid safetensors file ({_first_line(err)}); it may be truncated or "
        "of another format"
    )


def saved_config(metadata: Mapping[str, str], path: Path) -> Any:
    """The config (of its family's config class) that `save` wrote into a file's metadata
    (checked, not yet against the tensors: `check_header`)."""
    if CONFIG_KEY not in metadata:
        raise CheckpointError(
            f"{path} has no vitkit config in its metadata; it was not written by vitkit.save. "
            "Load it with vitkit.load_pretrained()"
        )
    try:
        config_cls = get_architecture(metadata.get(ARCH_KEY, _UNRECORDED_ARCH)).config_class
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}; it was written by another vitkit") from None
    try:
        return config_cls.from_dict(json.loads(metadata[CONFIG_KEY]))
    except (json.JSONDecodeError, TypeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path} has an invalid vitkit config: {err}") from None


def extra_metadata(metadata: Mapping[str, str], path: Path) -> dict[str, Any]:
    """The `meta` that `save` wrote (class names, data config, the training data, ...)."""
    try:
        meta = json.loads(metadata[META_KEY]) if META_KEY in metadata else {}
    except (json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path} has invalid vitkit metadata: {err}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} has invalid vitkit metadata: expected a JSON object")
    return meta


def read_metadata(path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """The model config and the extra metadata stored by `save`."""
    metadata, _ = safetensors_header(path)
    config = saved_config(metadata, Path(path))
    meta = extra_metadata(metadata, Path(path))
    check_class_names(meta, config.num_classes, Path(path))
    return config, meta


def check_class_names(meta: Mapping[str, Any], num_classes: int, path: Path) -> None:
    """Refuse `meta['class_names']` unless it is a list of `num_classes` strings."""
    names = meta.get("class_names")
    if names is None:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{path} has invalid class_names: expected a list of strings")
    if num_classes and len(names) != num_classes:
        raise CheckpointError(
            f"{path} names {len(names)} classes but its model has {num_classes} outputs; "
            "the metadata does not belong to these weights"
        )


def header_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every tensor in a safetensors file, read from its header alone."""
    return safetensors_header(path)[1]


def saved_shapes_problem(config: Any, shapes: Mapping[str, Sequence[int]]) -> str | None:
    """How a saved config and its file's tensor shapes disagree (None: they agree), from the
    config's whole model built on the meta device (no memory). A family with a cheaper or
    stricter check gives its own (`WeightsFamily.saved_shapes_problem`)."""
    with torch.device("meta"):
        expected = {k: v.shape for k, v in build_model(config).state_dict().items()}
    report = mismatch_report(expected, shapes)
    return f"its config does not match its tensors ({report})" if report else None


def check_header(
    config: Any,
    shapes: Mapping[str, Sequence[int]],
    path: Path,
    problem: Callable[[Any, Mapping[str, Sequence[int]]], str | None] = saved_shapes_problem,
) -> None:
    """Refuse a config that its file's tensors do not bear out, before any model is built: a
    config is metadata anyone can edit, and a claimed depth or image size allocates memory.
    `problem` compares them (the config's family's check)."""
    found = problem(config, shapes)
    if found:
        raise CheckpointError(f"{path}: {found}; the file is damaged or its metadata was edited")


def saved_data_config(meta: dict[str, Any], config: Any, source: str) -> DataConfig | None:
    """The data config a vitkit checkpoint's metadata records: `data_config`, or for files
    written before it existed the training data's mean / std (they were resized, not
    cropped); None when it records neither."""
    if "data_config" in meta:
        try:
            return DataConfig.from_dict(meta["data_config"], f"{source}: data_config")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    if "mean" in meta and "std" in meta:
        height, width = to_2tuple(config.img_size, "img_size")
        try:
            return DataConfig(
                input_size=(config.in_chans, height, width),
                mean=meta["mean"],
                std=meta["std"],
                interpolation="bilinear",
                crop_mode="squash",
            )
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{source}: invalid mean / std in its metadata: {err}") from None
    return None


def load_state_dict(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", *, mmap: bool = False
) -> dict[str, Tensor]:
    """Tensors from a `.safetensors`, `.pth`, `.pt` or `.bin` file, without running any code.

    Pickle-based files go through `torch.load(weights_only=True)`; a file that would need
    arbitrary unpickling is refused. A `{'model': state_dict}` or `{'state_dict': ...}`
    wrapper, as training scripts write, is unwrapped. With `mmap`, a zip-format file's tensors
    are mapped from the file, not read, until they are used.
    """
    path = _existing(path)
    if path.suffix == ".safetensors" or is_safetensors_file(path):
        try:
            return load_file(str(path), device=str(map_location))
        except Exception as err:  # safetensors raises several types for bad files
            raise CheckpointError(_invalid_safetensors(path, err)) from None
    if path.suffix == ".npz" or is_npz_file(path):
        raise CheckpointError(
            f"{path} is a NumPy .npz archive (a JAX/Flax checkpoint), not a PyTorch state dict; "
            "load it with vitkit.load_pretrained(path) or vitkit.convert.from_jax(path)"
        )
    if not _looks_like_torch_save(path):  # text, an image: torch.load would say "pop from
        raise CheckpointError(_not_weights(path))  # empty list" or a bare KeyError
    try:
        obj = torch.load(
            path,
            map_location=map_location,
            weights_only=True,
            mmap=mmap and zipfile.is_zipfile(path),  # torch maps only its zip format
        )
    except pickle.UnpicklingError as err:
        if not str(err).startswith("Weights only load failed"):
            raise CheckpointError(_unreadable(path, err)) from None
        raise CheckpointError(
            f"refusing to load {path}: it needs arbitrary unpickling, which can run code "
            f"({_unpickler_reason(err)}). Load it with torch.load(weights_only=False) only if "
            "you trust its source, then re-save it with vitkit.save"
        ) from None
    except Exception as err:  # torch.load raises many types for files of another format
        raise CheckpointError(_unreadable(path, err)) from None
    return _unwrap(obj, path)


def _looks_like_torch_save(path: Path) -> bool:
    """Whether `path` starts as torch.save writes: a zip archive, or a pickle (protocol 2+).
    A truncated one still does, and is reported as unreadable, not as another kind of file."""
    with open(path, "rb") as f:
        head = f.read(2)
    return head[:1] == b"\x80" or head == b"PK"


# What a file that is no weights file starts with -> what to call it.
_KNOWN_HEADS = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
}  # fmt: skip


def _is_text(head: bytes) -> bool:
    """Printable UTF-8; a character cut by the end of `head` still counts."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:
            return False
        text = head[: err.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\n\r\f" for c in text)


def _not_weights(path: Path) -> str:
    """One line for a file of another kind given where weights go."""
    with open(path, "rb") as f:
        head = f.read(4096)
    kind = next((name for magic, name in _KNOWN_HEADS.items() if head.startswith(magic)), None)
    if path.suffix == ".onnx":
        kind = "an ONNX model, which vitkit writes but does not load"
    if kind is None:
        kind = "text" if _is_text(head) else None
    what = f"it is {kind}" if kind else "its first bytes match no weights format"
    return (
        f"{path} is not a weights file vitkit reads: {what}; give a .safetensors, .pth or .bin "
        "file, a JAX .npz or a Hub folder"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _unreadable(path: Path, err: BaseException) -> str:
    return (
        f"{path} is not a readable PyTorch checkpoint ({type(err).__name__}: "
        f"{_first_line(err)[:200]}); it may be truncated or of another format"
    )


def _unpickler_reason(err: BaseException) -> str:
    """The line of torch's weights-only refusal that names what the pickle asked for."""
    for line in str(err).splitlines():
        line = line.strip()
        if line and not line.startswith(("Weights only load failed", "Please file", "Check the")):
            return line.removeprefix("WeightsUnpickler error:").strip() or "unsafe pickle"
    return "unsafe pickle"


def is_safetensors_file(path: str | os.PathLike) -> bool:
    """True when the file starts like safetensors: a u64 header length, then a JSON object."""
    with open(path, "rb") as f:
        head = f.read(9)
    size = Path(path).stat().st_size
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size


def is_npz_file(path: str | os.PathLike) -> bool:
    """True for a zip archive of `.npy` members (`numpy.savez`), as JAX/Flax checkpoints are."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and all(name.endswith(".npy") for name in names)


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` file, read with `allow_pickle=False` (no code can run)."""
    path = _existing(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except ValueError as err:
        if "allow_pickle" in str(err):
            raise CheckpointError(
                f"refusing to load {path}: it holds pickled Python objects, which can run code; "
                "a JAX checkpoint holds plain arrays only"
            ) from None
        raise CheckpointError(_unreadable_npz(path, err)) from None
    except Exception as err:  # zipfile / numpy raise several types for broken archives
        raise CheckpointError(_unreadable_npz(path, err)) from None


# `.npy` format version -> numpy's header reader.
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def npz_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every array of an `.npz` file, from the `.npy` headers alone."""
    path = _existing(path)
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                with archive.open(name) as member:
                    version = np.lib.format.read_magic(member)
                    read = _NPY_HEADERS.get(version)
                    if read is None:
                        raise ValueError(f"{name} is a .npy file of version {version}")
                    shape, _, dtype = read(member)
                if dtype.hasobject:
                    raise CheckpointError(
                        f"refusing to load {path}: it holds pickled Python objects, which can "
                        "run code; a JAX checkpoint holds plain arrays only"
                    )
                shapes[name.removesuffix(".npy")] = tuple(shape)
    except CheckpointError:
        raise
    except Exception as err:  # zipfile / numpy raise several types for broken archives
        raise CheckpointError(_unreadable_npz(path, err)) from None
    return shapes


def _unreadable_npz(path: Path, err: BaseException) -> str:
    return (
        f"{path} is not a readable .npz archive ({type(err).__name__}: "
        f"{_first_line(err)[:200]}); it may be truncated or of another format"
    )


def _unwrap(obj: object, path: Path) -> dict[str, Tensor]:
    for key in ("model", "state_dict", "model_state_dict", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return obj


def mismatch_report(
    expected: Mapping[str, Sequence[int]], state_dict: Mapping[str, Tensor | Sequence[int]]
) -> str | None:
    """Missing, unexpected and mis-shaped keys of `state_dict` (tensors, or their shapes)
    against `expected` shapes, as one readable line; None when they match."""
    found = {k: tuple(v.shape if isinstance(v, Tensor) else v) for k, v in state_dict.items()}
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    mismatched = sorted(
        f"{k}: checkpoint {found[k]} vs model {tuple(expected[k])}"
        for k in set(expected) & set(found)
        if tuple(expected[k]) != found[k]
    )
    parts = []
    for label, keys in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("wrong shape", mismatched),
    ):
        if keys:
            shown = ", ".join(keys[:5]) + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "")
            parts.append(f"{label}: {shown}")
    return "; ".join(parts) or None


def strip_prefix(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The state dict without `prefix` when every key has it (e.g. DDP's `module.`)."""
    if state_dict and all(k.startswith(prefix) for k in state_dict):
        return {k[len(prefix) :]: v for k, v in state_dict.items()}
    return dict(state_dict)


def load_into(
    model: torch.nn.Module, state_dict: dict[str, Tensor], source: str = "state dict"
) -> None:
    """`load_state_dict(strict=True)` with a readable report of missing, unexpected and
    mis-shaped keys instead of PyTorch's raw error."""
    report = mismatch_report({k: v.shape for k, v in model.state_dict().items()}, state_dict)
    if report:
        raise CheckpointError(
            f"{source} does not match the model ({report}); check that the checkpoint "
            "was made for this architecture (embed_dim, depth, patch size, num_classes)"
        )
    model.load_state_dict(state_dict, strict=True)


def weights_file(path: str | os.PathLike) -> Path:
    """The weights file of `path`: `model.safetensors` (else `pytorch_model.bin`) inside a
    Hugging Face / timm hub folder, or `path` itself when it is not a folder.

    A folder holding neither raises a CheckpointError; a missing file is left for the loader
    to report.
    """
    path = Path(path)
    if not path.is_dir():
        return path
    for name in WEIGHTS_FILES:
        if (path / name).is_file():
            return path / name
    raise CheckpointError(
        f"{path} is a folder without {' or '.join(WEIGHTS_FILES)}; pass a weights file"
    )


def _existing(path: str | os.PathLike) -> Path:
    """`path`, a non-empty file; else one CheckpointError saying what it is."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a weights file")
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes); the file was not written completely")
    return path
