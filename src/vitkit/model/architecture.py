"""What the rest of vitkit asks of a model family: one `Architecture` record per family.

A family (the ViT in `vit/`, the Swin in `swin/`) states once, in its own room, how it is
built, which config class holds its options, its presets, how it becomes a feature backbone,
how it is explained and whether it runs the fused CPU path; `registry.py` registers the records
and answers `architecture_of(model_or_config)`. Callers outside the family's room ask the
record instead of testing `isinstance` on a concrete model class, so a new family is a new
room and one registration (as timm's `build_model_with_cfg` + `register_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

EXPLANATIONS = ("attention", "gradcam")


@dataclass(frozen=True)
class Architecture:
    """One model family as the rest of vitkit sees it.

    Args:
        name: the family's key, as checkpoints record it ('vit', 'swin', 'swin_cr').
        title: how messages name it ('ViT', 'Swin Transformer').
        config_class: the config dataclass; its fields are the family's options
            (`--model-opt KEY=VALUE`, `vitkit models NAME --options`).
        build: config -> model.
        model_classes: the classes `build` makes (a model is asked by its class).
        presets: registered name -> config.
        backbone: (model, out_indices, output_fmt, prune) -> a feature backbone
            (`create_model(..., features_only=True)`).
        refused: names of the family's kind that vitkit does not build -> why (timm names
            of another backbone).
        feature_unit: what a feature map is read after ('block' or 'stage').
        explanation: how `vitkit explain` explains it: 'attention' (relevance, rollout and
            class-token maps over the tokens) or 'gradcam' (Grad-CAM on the last map).
        fused_cpu: whether the family has the fused CPU inference path (`set_fast_path`).
        default_out_indices: config -> the feature indices timm's `features_only` reads.
        masked_autoencoder: (encoder, **options) -> the family's MAE pretraining model
            (`vitkit pretrain`); None where the family has none.
        fixed_export_size: why its exports (ONNX, `torch.export`) take one image size, which
            refuses `dynamic_img_size=True`; None: they take what the model does.
    """

    name: str
    title: str
    config_class: type
    build: Callable[[Any], nn.Module]
    model_classes: tuple[type, ...]
    presets: Mapping[str, Any]
    backbone: Callable[..., nn.Module]
    refused: Mapping[str, str] = field(default_factory=dict)
    feature_unit: str = "block"
    explanation: str | None = "attention"
    fused_cpu: bool = False
    default_out_indices: Callable[[Any], int | Sequence[int] | None] = lambda config: 3
    masked_autoencoder: Callable[..., nn.Module] | None = None
    fixed_export_size: str | None = None

    def __post_init__(self) -> None:
        if self.explanation not in (*EXPLANATIONS, None):
            raise ValueError(f"explanation must be one of {EXPLANATIONS} or None")

    def option_names(self) -> list[str]:
        """The family's options: its config's fields."""
        return [f.name for f in fields(self.config_class)]

    def owns(self, config: Any) -> bool:
        """Whether `config` is this family's (exactly its class: a subclass may be another
        family, as the Swin V2-cr's config is the Swin's)."""
        return type(config) is self.config_class
