"""torchvision converter: parity with torchvision's ViT and the unsupported representation
layer."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError, convert


def test_torchvision_small_parity():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    source = randomize(
        TVViT(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=256,
            num_classes=7,
        )
    )
    sd, config = convert.from_torchvision(source.state_dict(), num_heads=4)
    assert (config.embed_dim, config.depth, config.num_classes, config.patch_size) == (64, 2, 7, 8)
    model = vitkit.load_pretrained(source.state_dict(), num_heads=4)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


@pytest.mark.slow
def test_torchvision_vit_b_16_parity():
    torchvision = pytest.importorskip("torchvision", reason="torchvision not installed")
    source = randomize(torchvision.models.vit_b_16(weights=None))
    sd, config = convert.from_torchvision(source.state_dict())
    assert (config.embed_dim, config.depth, config.num_heads) == (768, 12, 12)
    model = vitkit.load_pretrained(source.state_dict())
    x = images(224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


def test_torchvision_representation_layer_is_reported():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    source = TVViT(
        image_size=32,
        patch_size=8,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
        representation_size=16,
    )
    with pytest.raises(CheckpointError, match=r"representation layer is not supported"):
        convert.from_torchvision(source.state_dict())
