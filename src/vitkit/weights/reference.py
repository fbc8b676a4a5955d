"""The source library's own model holding the original weights, for parity checks
(`parity.py`), and what a source names of itself.

Two kinds: the library's generic model built from vitkit's inferred config (`source_model`:
timm `vision_transformer.py`, also for the npz files of google-research/vision_transformer read
by timm's own npz loader; Hugging Face `modeling_vit.py`, DINOv2, CLIP and SigLIP through
`hf_families.hf_family_model`; torchvision `vision_transformer.py`), which proves the key
mapping; and the model the source itself describes: the timm name a file or folder records
(`recorded_name`), transformers' model of a `config.json` read by its own `from_pretrained`
(`hf_pretrained`), which proves the function. Each reference gives its outputs by vitkit's
names (`Outputs`: 'output' is `model(x)`, 'features' the tokens, 'pooled' the pooled
features).

The libraries are optional extras (`pip install -e '.[interop]'`), so each is imported only
when its model is built.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..model import ViTConfig, get_config, list_models
from .checkpoint import (
    CONFIG_KEY,
    META_KEY,
    CheckpointError,
    is_npz_file,
    is_safetensors_file,
    mismatch_report,
    safetensors_header,
    saved_config,
)
from .detect import FORMATS
from .hf import LAYOUTS, from_hf, to_hf, to_hf_config
from .hf_families import hf_family, hf_family_model
from .layout import strip_prefix
from .timm import ARCH_FIELDS, timm_kwargs
from .torchvision import torchvision_kwargs

# A reference's outputs on a batch, by vitkit's names.
Outputs = Callable[[Tensor], dict[str, Tensor]]

# The fields a vitkit checkpoint's config must share with its recorded name to be that model.
_NAME_FIELDS = tuple(f for f in ARCH_FIELDS if not f.startswith("dynamic_"))


class ReferenceMismatch(Exception):
    """The reference cannot hold the weights, or gives outputs of other shapes than vitkit's."""


def source_model(format: str, config: ViTConfig, weights: Any) -> nn.Module:
    """The source library's model of `config` holding the original `weights` (a state dict,
    or the `.npz` path for 'jax', read by timm's own npz loader), in eval mode.

    Raises ImportError when the library is not installed. The model's `forward` returns
    logits (Hugging Face's output is unwrapped).
    """
    if format in ("timm", "vitkit", "jax"):
        from timm.models import deit, vision_transformer

        cls = deit.VisionTransformerDistilled if config.distilled else None
        cls = cls or vision_transformer.VisionTransformer
        model = cls(**timm_kwargs(config))
        if format == "jax":
            vision_transformer._load_weights(model, str(weights))
        else:
            model.load_state_dict(strip_prefix(weights, "module."), strict=True)
        return model.eval()
    if format == "torchvision":
        from torchvision.models.vision_transformer import VisionTransformer as TVViT

        model = TVViT(**torchvision_kwargs(config))
        model.load_state_dict(weights, strict=True)
        return model.eval()
    if format == "hf" and hf_family(weights) != "vit":  # DINOv2, CLIP, SigLIP
        return hf_family_model(config, weights)
    if format == "hf":
        import transformers

        hf_config = transformers.ViTConfig(**to_hf_config(config))
        if config.num_classes:
            inner = transformers.ViTForImageClassification(hf_config)
        else:
            inner = transformers.ViTModel(hf_config, add_pooling_layer=False)
        own = set(inner.state_dict())
        kept = {k: v for k, v in weights.items() if k in own}  # drops the unused pooler
        if set(kept) != own:  # the other naming (Hub files vs transformers 5 modules)
            converted = from_hf(weights, config=to_hf_config(config))
            for layout in LAYOUTS:
                kept = to_hf(*converted, layout=layout)
                if set(kept) == own:
                    break
        inner.load_state_dict(kept, strict=True)
        return _HFLogits(inner).eval()
    raise ValueError(f"unknown format {format!r}; expected one of {FORMATS}")


class _HFLogits(nn.Module):
    """A Hugging Face ViT whose forward returns a tensor: logits, or the final tokens."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(pixel_values=x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


# -- what a source names of itself ----------------------------------------------------------


def recorded_name(source: str | os.PathLike) -> str | None:
    """The timm model name a file or folder records: a timm folder's `architecture`, the
    `model_name` of a vitkit checkpoint whose config has that name's options, or a timm
    training checkpoint's `arch` (or `pretrained_cfg['architecture']`); None if none."""
    path = Path(source)
    if path.is_dir():
        config = path / "config.json"
        try:
            values = json.loads(config.read_text()) if config.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None
        name = values.get("architecture") if isinstance(values, dict) else None
        return name if isinstance(name, str) else None
    try:
        if path.suffix == ".npz" or is_npz_file(path):
            return None
        if path.suffix == ".safetensors" or is_safetensors_file(path):
            return _vitkit_name(path, safetensors_header(path)[0])
        return _pickled_name(path)
    except (CheckpointError, OSError):
        return None


def _vitkit_name(path: Path, metadata: Mapping[str, str]) -> str | None:
    try:
        meta = json.loads(metadata.get(META_KEY, "{}"))
    except (json.JSONDecodeError, RecursionError):
        return None
    name = meta.get("model_name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or CONFIG_KEY not in metadata:
        return None
    if name in list_models():  # the model options may have changed what the name computes
        saved, named = saved_config(metadata, path), get_config(name)
        if any(getattr(saved, f) != getattr(named, f) for f in _NAME_FIELDS):
            return None
    return name


def _pickled_name(path: Path) -> str | None:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # the conversion read it already; a name is optional
        return None
    if not isinstance(obj, dict):
        return None
    cfg = obj.get("pretrained_cfg")
    name = cfg.get("architecture") if isinstance(cfg, dict) else obj.get("arch")
    return name if isinstance(name, str) else None


def folder_model_args(path: Path) -> dict[str, Any]:
    """A timm folder's `model_args`, the keyword arguments timm builds it with."""
    if not path.is_dir() or not (path / "config.json").is_file():
        return {}
    try:
        args = json.loads((path / "config.json").read_text()).get("model_args")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, AttributeError):
        return {}
    return dict(args) if isinstance(args, dict) else {}


def strict_load(reference: nn.Module, weights: Mapping[str, Tensor]) -> None:
    """`load_state_dict(strict=True)`; weights the reference does not fit are a
    `ReferenceMismatch` naming the keys."""
    report = mismatch_report({k: v.shape for k, v in reference.state_dict().items()}, weights)
    if report:
        raise ReferenceMismatch(f"that model does not hold these weights ({report})")
    reference.load_state_dict(weights, strict=True)


def timm_outputs(reference: nn.Module) -> Outputs:
    """A timm ViT's outputs: `model(x)` and `forward_features` (the tokens)."""
    reference.eval()
    return lambda x: {"output": reference(x), "features": reference.forward_features(x)}


def hf_class(hub: Mapping[str, Any], transformers: Any) -> str:
    """The class a config.json's `architectures` names, else `AutoModel`'s for its type."""
    names = hub.get("architectures") or []
    if names and hasattr(transformers, names[0]):
        return names[0]
    return "AutoModel"


def hf_pretrained(
    transformers: Any,
    name: str,
    hub: Mapping[str, Any],
    folder: Path | None,
    weights: Mapping[str, Tensor],
) -> nn.Module:
    """transformers' `name` read by its own `from_pretrained` from `folder`, or from the
    `weights` and the config `hub` written to a temporary one; weights it lacks are refused."""
    from safetensors.torch import save_file

    options = {"mask_ratio": 0.0} if hub.get("model_type") == "vit_mae" else {}
    cls = getattr(transformers, name)
    with tempfile.TemporaryDirectory() as temporary:
        if folder is None:
            folder = Path(temporary)
            (folder / "config.json").write_text(json.dumps(dict(hub)))
            tensors = {k: v.detach().clone().contiguous() for k, v in weights.items()}
            save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        try:
            loaded, loading = cls.from_pretrained(str(folder), output_loading_info=True, **options)
        except (OSError, ValueError, RuntimeError, KeyError) as err:
            raise ReferenceMismatch(
                f"transformers cannot read the weights as a {name} ({err})"
            ) from None
    unused = ("pooler.",) if hub.get("model_type") == "vit" else ()  # not compared
    missing = sorted(k for k in loading["missing_keys"] if not any(k.startswith(p) for p in unused))
    problems = [f"missing: {', '.join(missing[:5])}"] if missing else []
    if loading["mismatched_keys"]:
        problems.append(f"wrong shape: {', '.join(sorted(map(str, loading['mismatched_keys'])))}")
    if problems:
        raise ReferenceMismatch(
            f"transformers' {name} does not hold these weights ({'; '.join(problems)})"
        )
    return loaded.float().eval()


def hf_outputs(inner: nn.Module) -> Outputs:
    """transformers' outputs by vitkit's names: logits / image embeddings ('output'),
    `last_hidden_state` ('features'), `pooler_output` ('pooled'; not ViT's tanh pooler). A
    two-tower model's image tower."""
    model_type = getattr(inner.config, "model_type", "")
    two_tower = "input_ids" in inspect.signature(inner.forward).parameters

    def outputs(x: Tensor) -> dict[str, Tensor]:
        extra = {}
        if model_type == "vit_mae":  # no masking, no shuffle: the tokens in order
            extra["noise"] = torch.arange(x.shape[-2] * x.shape[-1] // _patches(inner)).expand(
                x.shape[0], -1
            )
        out = (inner.vision_model if two_tower else inner)(pixel_values=x, **extra)
        found = {
            "output": getattr(out, "logits", None),
            "features": getattr(out, "last_hidden_state", None),
            "pooled": getattr(out, "pooler_output", None) if model_type != "vit" else None,
        }
        if found["output"] is None:
            found["output"] = getattr(out, "image_embeds", None)
        if two_tower and hasattr(inner, "visual_projection"):
            found["output"] = inner.visual_projection(found["pooled"])
        return {k: v.float() for k, v in found.items() if v is not None}

    return outputs


def _patches(inner: nn.Module) -> int:
    patch = inner.config.patch_size
    return patch * patch if isinstance(patch, int) else patch[0] * patch[1]


@contextlib.contextmanager
def quiet_transformers(transformers: Any) -> Iterator[None]:
    """transformers' progress bars and load reports off while the reference is built."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
