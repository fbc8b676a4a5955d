"""The model's split into vit.py, timm_api.py, intermediates.py and weight_init.py keeps the old
import paths and leaves one definition of each name."""

from __future__ import annotations

import vitkit.model.features as features
import vitkit.model.vit.vit as vit
from vitkit.model.intermediates import IntermediateFeatures, take_indices
from vitkit.model.layers.weight_init import trunc_normal_
from vitkit.model.timm_cfg import TimmPretrainedCfg
from vitkit.model.vit.timm_api import TimmModelApi


def test_names_moved_out_of_vit_py_are_still_importable_from_it():
    assert vit.take_indices is take_indices is features.take_indices
    assert vit.trunc_normal_ is trunc_normal_
    assert set(vit.__all__) == {"VisionTransformer", "take_indices", "trunc_normal_"}


def test_the_timm_api_and_intermediates_are_defined_once_in_their_modules():
    model_methods = {
        "forward_intermediates": IntermediateFeatures,
        "get_intermediate_layers": IntermediateFeatures,
        "prune_intermediate_layers": TimmModelApi,
        "set_input_size": TimmModelApi,
        "reset_classifier": TimmModelApi,
        "group_matcher": TimmModelApi,
        "pretrained_cfg": TimmPretrainedCfg,  # every family's, in model/timm_cfg.py
    }
    for name, owner in model_methods.items():
        assert name in vars(owner), name
        assert name not in vars(vit.VisionTransformer), name
        assert getattr(vit.VisionTransformer, name) is vars(owner)[name]
