"""The source library's own model beside vitkit's, for parity checks (`parity.py` and the
families' own checks, `vit/parity.py`, `swin/parity.py`): what a check compared (`Parity`), the
comparison on a random batch, and the references every family shares: the model the source
itself describes (transformers' model of a `config.json` read by its own `from_pretrained`,
`hf_pretrained`; a timm model loaded strictly, `strict_load`), each giving its outputs by
vitkit's names (`Outputs`: 'output' is `model(x)`, 'features' the tokens, 'pooled' the pooled
features).

The libraries are optional extras (`pip install -e '.[interop]'`), so each is imported only
when its model is built.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..model import get_config, list_models
from ..model.layers.patch_embed import to_2tuple
from .checkpoint import OPTION_FORMS, mismatch_report

# A reference's outputs on a batch, by vitkit's names.
Outputs = Callable[[Tensor], dict[str, Tensor]]


class ReferenceMismatch(Exception):
    """The reference cannot hold the weights, or gives outputs of other shapes than vitkit's."""


# The largest |difference| accepted between the two models' outputs (float32, random weights).
PARITY_TOLERANCE = 1e-4


INSTALL = "pip install 'vitkit[interop]'"
ACTIVATIONS = {"gelu": "exact GELU", "gelu_tanh": "tanh GELU", "quick_gelu": "QuickGELU"}


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
            text += f"; the weights do not record {and_list(self.assumed)}"
            if self.fix is not None:
                option, purpose = self.fix
                text += f": pass {forms.get(option, option + '=')} {purpose}"
        return text

    def _measured(self) -> str:
        what = and_list(tuple(dict.fromkeys(self.compared)))
        return f"max |difference| {self.difference:.2e} over the {what} of a random batch of 2"


# -- the comparison ---------------------------------------------------------------------------


def compare(model: nn.Module, outputs: Outputs, **fields: Any) -> Parity:
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
    names = {
        "output": "logits" if cfg.num_classes else "pooled features",
        "features": "tokens",
        "pooled": "pooled features",
    }
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


def run(model: nn.Module, build: Callable[[], Outputs], **fields: Any) -> Parity:
    """`_compare` with the reference `build` makes; its refusal is a mismatch."""
    try:
        return compare(model, build(), **fields)
    except ReferenceMismatch as err:
        return Parity(refused=str(err), **fields)
    except RuntimeError as err:  # torch's load_state_dict of a generic reference
        reason = " ".join(str(err).split())[:300]
        return Parity(refused=f"that model does not hold these weights ({reason})", **fields)


def not_installed(library: str, reference: str | None, **fields: Any) -> Parity:
    return Parity(reference=reference, note=f"{library} is not installed ({INSTALL})", **fields)


def and_list(items: tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def created(name: str, kwargs: Mapping[str, Any]) -> str:
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


# -- the references every family shares ------------------------------------------------------


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
