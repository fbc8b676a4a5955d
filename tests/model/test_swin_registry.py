"""Every Swin name timm registers is a vitkit name with timm's parameter count (both built on
the meta device: no memory, no time), and `vitkit models` lists them."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, requires_timm
from vitkit import SwinTransformer, cli, create_model, list_models

timm = optional_import("timm")

# timm's names vitkit does not build yet (Swin V2-cr, timm's own variant of V2: another block).
NOT_YET = "swinv2_cr_*"
SWIN_NAMES = list_models("swin*")


@requires_timm
def test_the_names_are_timms_swin_names():
    theirs = set(timm.list_models("swin*")) - set(timm.list_models(NOT_YET))
    assert set(SWIN_NAMES) == theirs and len(SWIN_NAMES) == 21


@requires_timm
@pytest.mark.parametrize("name", SWIN_NAMES)
def test_parameter_counts_and_keys_equal_timms(name):
    with torch.device("meta"):
        ours = create_model(name)
        theirs = timm.create_model(name, pretrained=False)
    assert isinstance(ours, SwinTransformer)
    shapes = {key: tuple(value.shape) for key, value in ours.state_dict().items()}
    assert shapes == {key: tuple(value.shape) for key, value in theirs.state_dict().items()}
    assert ours.num_classes == theirs.num_classes
    assert ours.patch_embed.img_size == tuple(theirs.patch_embed.img_size)


def test_known_counts():
    with torch.device("meta"):
        tiny = create_model("swin_tiny_patch4_window7_224")
        v2 = create_model("swinv2_base_window12to16_192to256", num_classes=10)
    assert sum(p.numel() for p in tiny.parameters()) == 28_288_354  # timm's Swin-T
    assert sum(p.numel() for p in v2.parameters()) == 87_918_816 - 990 * 1025


def test_vitkit_models_lists_them(capsys):
    assert cli.main(["models", "swinv2_tiny*"]) == 0
    out = capsys.readouterr().out
    assert out.split() == ["swinv2_tiny_window16_256", "swinv2_tiny_window8_256"]
