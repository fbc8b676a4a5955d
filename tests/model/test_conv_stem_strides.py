"""Conv stems with stride-1 layers (Xiao et al., "Early Convolutions Help Transformers See
Better", 2021: the larger ViT_c stems), and torchvision's `conv_stem_configs` weights, whose
strides the weights do not show: the image size is the position grid times the total stride."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import randomize
from vitkit import CheckpointError, convert

XIAO = (2, 2, 1, 2, 1, 2)  # total stride 16: a 224 model on a 14 x 14 grid


def _torchvision_stem_vit(strides: tuple[int, ...], image_size: int = 64) -> torch.nn.Module:
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import ConvStemConfig, VisionTransformer

    torch.manual_seed(0)
    stem = [ConvStemConfig(8 * (i + 1), 3, stride) for i, stride in enumerate(strides)]
    patch = 2 ** sum(stride == 2 for stride in strides)
    model = VisionTransformer(image_size=image_size, patch_size=patch, num_layers=1, num_heads=2,
                              hidden_dim=32, mlp_dim=64, num_classes=5,
                              conv_stem_configs=stem)  # fmt: skip
    return randomize(model)


def test_a_stride_1_layer_keeps_the_size():
    model = vitkit.VisionTransformer(img_size=32, patch_size=1, conv_stem=(8, 8, 16),
                                     conv_stem_strides=(2, 1, 2), embed_dim=32, depth=1,
                                     num_heads=4)  # fmt: skip
    assert model.patch_embed.grid_size == (8, 8) and model.patch_embed.reduction == (4, 4)
    assert [m.stride for m in model.patch_embed.backbone if isinstance(m, torch.nn.Conv2d)] == [
        (2, 2), (1, 1), (2, 2)
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"^conv_stem_strides has 2 strides for 3 conv_stem"):
        vitkit.ViTConfig(conv_stem=(8, 8, 16), conv_stem_strides=(2, 1), patch_size=1)


def test_torchvision_stem_with_stride_1_layers_loads_at_its_size():
    source = _torchvision_stem_vit(XIAO, image_size=64)  # 4 x 4 tokens
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    # The weights alone: 6 stride-2 layers would be 64-pixel patches (a 256-pixel model that
    # refuses 64-pixel images); what they do not show is refused.
    with pytest.raises(CheckpointError, match=r"^torchvision's conv stem of 6 layers: the weig"):
        convert.from_torchvision(source.state_dict(), num_heads=2)
    model = vitkit.load_pretrained(source.state_dict(), num_heads=2, conv_stem_strides=XIAO)
    assert model.config.img_size == 64  # 4 tokens x the total stride 16
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=1e-5, atol=1e-5)
    rebuilt = convert.source_model("torchvision", model.config, source.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), source(x), rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"img_size 64 on 4 x 4 tokens do not show"):
        convert.from_torchvision(source.state_dict(), num_heads=2, img_size=64)


def test_a_shallow_torchvision_stem_is_taken_as_stride_2():
    source = _torchvision_stem_vit((2, 2, 2, 2), image_size=64)
    _, config = convert.from_torchvision(source.state_dict(), num_heads=2)
    assert (config.img_size, config.conv_stem_layer_strides) == (64, (2, 2, 2, 2))
