"""transformers' Swin backbones (`SwinBackbone`, `Swinv2Backbone`, the feature extractors of
its DETR / Mask2Former / UperNet heads) as vitkit's `SwinBackbone`, feature maps equal.

Their maps are each stage's output before its patch merging, which is timm's stage output
(timm merges at the start of the next stage). `SwinBackbone` adds a LayerNorm per output stage
(`hidden_states_norms`: vitkit's `stage_norms`), runs its stages with `always_partition=True`
and carries an unused final norm; `Swinv2Backbone` has neither norms nor a final norm (an
identity one is filled in). Both pad each map to whole windows before the shift
(`windows_like='hf'`), at any image size; `out_features` ('stage1' ... ) are the stages read,
'stem' (the patch embedding) has no counterpart and is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...model import SwinBackbone
from ..checkpoint import CheckpointError, load_state_dict, weights_file
from ..hub import hf_config_dict
from ..info import processor_data_config
from ..pretrained import load_pretrained

BACKBONES = ("SwinBackbone", "Swinv2Backbone")
_NORMS = "hidden_states_norms."


def load_hf_swin_backbone(folder: str | os.PathLike, **overrides: Any) -> SwinBackbone:
    """A transformers `SwinBackbone` / `Swinv2Backbone` folder (`config.json` and its weights)
    as a `SwinBackbone` of the folder's `out_features`, NCHW maps as its `feature_maps`;
    `overrides` are `SwinConfig` fields (e.g. `dynamic_img_size=True`)."""
    folder = Path(folder)
    config = hf_config_dict(folder / "config.json")
    kind = next((a for a in config.get("architectures") or () if a in BACKBONES), None)
    if kind is None:
        raise CheckpointError(
            f"{folder} is not a transformers Swin backbone (its config.json names "
            f"{config.get('architectures')}); read it with vitkit.load_pretrained"
        )
    stages = len(config.get("depths", (2, 2, 6, 2)))
    names = ["stem", *(f"stage{i}" for i in range(1, stages + 1))]
    features = config.get("out_features") or [names[-1]]
    if "stem" in features:
        raise CheckpointError(
            f"{folder}: out_features {features} include 'stem' (the patch embedding), which "
            "vitkit's SwinBackbone does not give; read the stages only"
        )
    weights = load_state_dict(weights_file(folder))
    norms = {k[len(_NORMS) :]: weights.pop(k) for k in list(weights) if k.startswith(_NORMS)}
    if kind == "Swinv2Backbone":
        _identity_final_norm(weights, config, stages)
    options: dict[str, Any] = {"windows_like": "hf", "dynamic_img_pad": True}
    if kind == "SwinBackbone":
        options["always_partition"] = True
    trunk = {**config, "architectures": []}  # read as the Swin it runs
    model = load_pretrained(weights, hf_config=trunk, **{**options, **overrides})
    data_config = processor_data_config(folder, model.config)
    if data_config is not None:
        model.data_config = data_config
    indices = [names.index(f) - 1 for f in features]
    backbone = SwinBackbone(model, indices, stage_norm_eps=1e-5 if norms else None)
    if backbone.stage_norms is not None:
        state = {
            f"{i}.{leaf}": norms[f"{name}.{leaf}"]
            for i, name in enumerate(features)
            for leaf in ("weight", "bias")
        }
        backbone.stage_norms.load_state_dict(state)
    return backbone.eval()


def _identity_final_norm(weights: dict[str, Tensor], config: dict[str, Any], stages: int) -> None:
    """A final LayerNorm that `Swinv2Backbone` lacks, as ones and zeros (the backbone does not
    use it; vitkit's Swin has one)."""
    width = config.get("embed_dim", 96) * 2 ** (stages - 1)
    weights.setdefault("layernorm.weight", torch.ones(width))
    weights.setdefault("layernorm.bias", torch.zeros(width))
