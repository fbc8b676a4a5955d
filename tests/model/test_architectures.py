"""Every family is one `Architecture` record, registered once; callers ask it."""

import dataclasses

import pytest
import torch

from vitkit.model import (
    architecture_of,
    architectures,
    build_model,
    create_model,
    find_architecture,
    get_architecture,
    get_config,
    list_models,
    registry,
)


def test_the_registered_families_and_their_presets():
    assert [a.name for a in architectures()] == [
        "vit",
        "swin",
        "swin_cr",
        "eva",
        "beit",
        "sam",
        "relpos",
    ]
    counts = {a.name: len(a.presets) for a in architectures()}
    assert sum(counts.values()) == len(list_models())
    assert counts["swin"] + counts["swin_cr"] == len(list_models("swin*"))  # 37, as timm's
    assert counts["swin_cr"] == len(list_models("swinv2_cr_*")) == 16
    assert counts["eva"] == 65  # timm's eva.py
    assert counts["beit"] == 7  # timm's beit.py
    assert counts["sam"] == 4  # timm's vision_transformer_sam.py
    assert counts["relpos"] == 14  # timm's vision_transformer_relpos.py


@pytest.mark.parametrize(
    "name, arch", [("vit_digits", "vit"), ("swin_tiny_patch4_window7_224", "swin"),
                   ("swinv2_cr_tiny_224", "swin_cr"), ("eva02_tiny_patch14_224", "eva"),
                   ("beitv2_base_patch16_224", "beit"),
                   ("samvit_base_patch16", "sam"),
                   ("vit_relpos_small_patch16_224", "relpos")]
)  # fmt: skip
def test_a_config_a_model_and_a_backbone_answer_their_record(name, arch):
    config = get_config(name)
    assert architecture_of(config).name == arch
    small = dict(depth=3) if arch in ("vit", "eva", "beit", "relpos") else dict(depths=(1, 1, 1, 1))
    if arch == "sam":
        small = dict(depth=3, global_attn_indexes=(2,), img_size=64)
    model = build_model(config.replace(**small))
    assert architecture_of(model) is get_architecture(arch)
    assert type(model) in get_architecture(arch).model_classes
    backbone = create_model(name, features_only=True, **small)
    assert architecture_of(backbone).name == arch


def test_a_thing_of_no_family_is_refused_in_one_line():
    assert find_architecture(torch.nn.Linear(2, 2)) is None
    with pytest.raises(ValueError, match="^Linear is not a model or config of a vitkit family$"):
        architecture_of(torch.nn.Linear(2, 2))
    with pytest.raises(
        ValueError,
        match="unknown architecture 'convnext'; registered: vit, swin, swin_cr, eva, beit, sam, "
        "relpos",
    ):
        get_architecture("convnext")


def test_the_registry_refuses_a_second_family_or_preset_of_the_same_name(monkeypatch):
    monkeypatch.setattr(registry, "_ARCHITECTURES", dict(registry._ARCHITECTURES))
    monkeypatch.setattr(registry, "_PRESETS", dict(registry._PRESETS))
    vit = get_architecture("vit")
    with pytest.raises(ValueError, match="architecture 'vit' is registered already"):
        registry.register(vit)
    twin = dataclasses.replace(vit, name="vit2", presets={"vit_digits": vit.presets["vit_digits"]})
    with pytest.raises(ValueError, match="ViT presets vit_digits are registered already"):
        registry.register(twin)
    fresh = dataclasses.replace(vit, name="vit2", presets={"vit2_tiny": vit.presets["vit_digits"]})
    registry.register(fresh)
    assert "vit2_tiny" in list_models("vit2_*")


def test_each_family_states_how_it_is_explained_and_read_as_features():
    facts = {a.name: (a.explanation, a.feature_unit, a.fused_cpu) for a in architectures()}
    assert facts == {
        "vit": ("attention", "block", True),
        "swin": ("gradcam", "stage", False),
        "swin_cr": ("gradcam", "stage", False),
        "eva": ("attention", "block", True),
        "beit": ("attention", "block", False),
        "sam": (None, "block", False),
        "relpos": ("attention", "block", False),
    }
    assert get_architecture("vit").masked_autoencoder is not None
    assert get_architecture("swin").masked_autoencoder is None
