"""Every Swin name timm registers (V2-cr's too) is a vitkit name with timm's parameter count and
keys (both built on the meta device: no memory, no time), and `vitkit models` lists them."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, requires_timm
from vitkit import SwinTransformer, cli, create_model, list_models
from vitkit.model import SwinTransformerV2Cr

timm = optional_import("timm")

SWIN_NAMES = list_models("swin*")


@requires_timm
def test_the_names_are_timms_swin_names():
    assert set(SWIN_NAMES) == set(timm.list_models("swin*")) and len(SWIN_NAMES) == 37
    assert list_models("swinv2_cr*") == sorted(timm.list_models("swinv2_cr*"))
    assert len(list_models("swinv2_cr*")) == 16


@requires_timm
@pytest.mark.parametrize("name", SWIN_NAMES)
def test_parameter_counts_and_keys_equal_timms(name):
    with torch.device("meta"):
        ours = create_model(name)
        theirs = timm.create_model(name, pretrained=False)
    assert isinstance(ours, SwinTransformerV2Cr if "_cr_" in name else SwinTransformer)
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
    with torch.device("meta"):
        cr = create_model("swinv2_cr_tiny_ns_224")
        huge = create_model("swinv2_cr_huge_384")
    assert isinstance(cr, SwinTransformerV2Cr)
    assert sum(p.numel() for p in cr.parameters()) == 28_333_468  # timm's, with 3 stage norms
    assert sum(p.numel() for p in huge.parameters()) == 657_938_780  # 11 heads per 352 width


def test_vitkit_models_lists_them(capsys):
    assert cli.main(["models", "swinv2_tiny*"]) == 0
    out = capsys.readouterr().out
    assert out.split() == ["swinv2_tiny_window16_256", "swinv2_tiny_window8_256"]
