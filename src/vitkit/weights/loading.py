"""Weights loaded ready to run, from one `inspect` of the file: `load` (a checkpoint vitkit
wrote) and `load_any` (any weights `inspect` recognises: a vitkit checkpoint, a timm CNN, or
timm / Hugging Face / torchvision / JAX weights of a ViT).

Every model comes back in eval mode with `model.meta` (a vitkit checkpoint's metadata, or the
class names the source gives) and `model.data_config` (the preparation the source states, or
the assumed one, said in one log line)."""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from ..model import build_model
from .checkpoint import (
    CheckpointError,
    check_class_names,
    load_into,
    load_state_dict,
    mismatch_report,
)
from .cnn import rebuild
from .families import check_arch
from .info import WeightsInfo, inspect
from .preprocessing import assumed_data_config
from .pretrained import load_pretrained

log = logging.getLogger(__name__)


def load(
    path: str | os.PathLike | WeightsInfo, map_location: str | torch.device = "cpu"
) -> nn.Module:
    """Rebuild a model saved by `save`, in eval mode; its extra metadata is `model.meta`.

    The config in the metadata is checked against the tensor shapes in the file's header
    before the model is built. A timm CNN's file (`--model timm:NAME`) is rebuilt by timm.
    Weights of other libraries are refused, naming what they are: `load_pretrained` and
    `load_any` read them."""
    info = path if isinstance(path, WeightsInfo) else inspect(path)
    if info.format not in ("vitkit", "timm-cnn") or info.folder is not None:
        raise CheckpointError(
            f"{info.path} is {info.kind}, not a checkpoint vitkit.save wrote (no vitkit config "
            "in its metadata); read it with vitkit.load_pretrained() or weights.load_any()"
        )
    return _built(info, map_location)


def load_any(
    source: str | os.PathLike | WeightsInfo,
    *,
    num_heads: int | None = None,
    arch: str | None = None,
    hf_config: object = None,
    map_location: str | torch.device = "cpu",
) -> nn.Module:
    """A ready model from any weights `inspect` recognises, as they are (their own head and
    size): a vitkit checkpoint, a timm CNN, or the weights of a ViT that `load_pretrained`
    reads (timm, Hugging Face, torchvision, JAX; a file or a model folder).

    Args:
        source: the file or folder, or what `inspect` said of it.
        num_heads, arch, hf_config: what the weights do not record (`load_pretrained`'s);
            an `arch` whose sizes differ from the weights' is refused (`ArchMismatchError`).
        map_location: the device the weights are loaded to.
    """
    info = source
    if not isinstance(info, WeightsInfo):
        info = inspect(source, num_heads=num_heads, arch=arch, hf_config=hf_config)
    if info.format == "onnx":
        raise CheckpointError(
            f"{info.path} is an ONNX model; this needs PyTorch weights (a vitkit checkpoint, "
            "or timm / Hugging Face / torchvision / JAX weights)"
        )
    if arch is not None and info.config is not None:  # its family checks it (or when read)
        check_arch(info.config, arch)  # a name of other sizes is another model
    if info.format == "vitkit" and num_heads not in (None, info.config.num_heads):
        raise CheckpointError(
            f"{info.path} is a vitkit checkpoint of {info.config.num_heads} heads, which its "
            f"config records; a head count of {num_heads} contradicts it: drop it"
        )
    if info.format in ("vitkit", "timm-cnn"):
        return _built(info, map_location)
    info.require_config()  # the reason first, before any tensor is read
    model = load_pretrained(info, num_heads=num_heads, arch=arch, hf_config=hf_config)
    model.meta = {"class_names": list(info.class_names)} if info.class_names else {}
    return model.to(map_location)


def _built(info: WeightsInfo, map_location: str | torch.device) -> nn.Module:
    """The model of a file vitkit wrote (or of a timm CNN folder), its weights loaded."""
    if info.format == "timm-cnn":
        model = _timm_cnn(info)
    else:
        model = build_model(info.require_config())
    state_dict = dict(info.tensors) if info.tensors is not None else None
    if state_dict is None:
        state_dict = load_state_dict(info.weights_file, map_location=map_location)
    load_into(model, state_dict, source=str(info.weights_file))
    model.meta = dict(info.meta)
    if info.class_names and "class_names" not in model.meta:
        model.meta["class_names"] = list(info.class_names)
    model.data_config = info.data_config or assumed_data_config(
        info.format, info.config, str(info.path)
    )
    return model.to(map_location).eval()


def _timm_cnn(info: WeightsInfo) -> nn.Module:
    """The timm CNN `info.cnn` names, its shapes checked against the file's on the meta
    device before it is built."""
    probe = rebuild(info.cnn, meta_device=True)  # shapes, no memory
    report = mismatch_report({k: v.shape for k, v in probe.state_dict().items()}, info.shapes)
    if report:
        raise CheckpointError(
            f"{info.path}: its timm model does not match its tensors ({report}); the file is "
            "damaged or its metadata was edited"
        )
    names = {"class_names": list(info.class_names)} if info.class_names else {}
    check_class_names(names, info.cnn["num_classes"], info.weights_file)
    return rebuild(info.cnn)
