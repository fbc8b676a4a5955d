"""The source library's generic ViT built from vitkit's inferred config, holding the original
weights (`source_model`): timm `vision_transformer.py` (also for the npz files of
google-research/vision_transformer, read by timm's own npz loader), Hugging Face
`modeling_vit.py` (DINOv2, CLIP and SigLIP through `hf_families.hf_family_model`) and
torchvision `vision_transformer.py`. It proves the key mapping, not the function (what the
weights do not record is assumed on both sides alike): the parity checks' reference where the
source names no model of its own.

The libraries are optional extras (`pip install -e '.[interop]'`), so each is imported only
when its model is built.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...model import ViTConfig
from ..checkpoint import strip_prefix
from .hf import LAYOUTS, from_hf, to_hf, to_hf_config
from .hf_families import hf_family, hf_family_model
from .timm import timm_kwargs
from .torchvision import torchvision_kwargs

# The formats whose reference it builds.
_FORMATS = ("vitkit", "timm", "hf", "torchvision", "jax")


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
    raise ValueError(f"unknown format {format!r}; expected one of {_FORMATS}")


class _HFLogits(nn.Module):
    """A Hugging Face ViT whose forward returns a tensor: logits, or the final tokens."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(pixel_values=x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
