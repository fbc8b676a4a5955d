"""The hybrid model (paper Section 3.1): a conv stem whose feature map is cut into patches."""

import math

import pytest
import torch
import torch.nn.functional as F

from vitkit import VisionTransformer, ViTConfig, create_model, load, save
from vitkit.model.layers import ConvStem, conv_to_unfold_weight
from vitkit.model.layers.patch_embed import stem_output_size

SMALL = dict(
    img_size=30, patch_size=2, in_chans=3, conv_stem=(8, 16), num_classes=5, embed_dim=32,
    depth=2, num_heads=4,
)  # fmt: skip


def small(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**SMALL, **overrides}).eval()


def test_stem_output_size_rounds_up_like_a_padded_stride_2_convolution():
    for size in range(1, 40):
        conv = torch.nn.Conv2d(1, 1, 3, stride=2, padding=1)
        out = conv(torch.zeros(1, 1, size, size)).shape[-1]
        assert stem_output_size(size, 1) == out
    assert [stem_output_size(28, n) for n in range(4)] == [28, 14, 7, 4]


def test_patch_tokens_are_the_projection_of_the_stem_feature_map():
    model = small()
    for bn in (model.patch_embed.backbone[1], model.patch_embed.backbone[4]):  # non-trivial stats
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 30, 30)
    # The reference written out: conv -> BN (running stats) -> ReLU, twice; 2x2 patches.
    h = x
    for conv, bn in ((0, 1), (3, 4)):
        conv, bn = model.patch_embed.backbone[conv], model.patch_embed.backbone[bn]
        h = F.conv2d(h, conv.weight, stride=2, padding=1)
        h = F.batch_norm(h, bn.running_mean, bn.running_var, bn.weight, bn.bias, eps=bn.eps)
        h = h.relu()
    assert h.shape == (2, 16, 8, 8)  # 30 -> 15 -> 8
    proj = model.patch_embed.proj
    expected = F.conv2d(h, proj.weight, proj.bias, stride=2).flatten(2).transpose(1, 2)
    with torch.no_grad():
        tokens, grid = model.patch_embed(x)
    assert grid == model.patch_embed.grid_size == (4, 4)
    torch.testing.assert_close(tokens, expected, rtol=1e-5, atol=1e-5)


def test_unfold_patch_embedding_computes_the_same_function_after_a_stem():
    conv = small()
    unfold = small(patch_embed="unfold")
    sd = conv.state_dict()
    sd["patch_embed.proj.weight"] = conv_to_unfold_weight(sd["patch_embed.proj.weight"])
    unfold.load_state_dict(sd)
    x = torch.randn(2, 3, 30, 30)
    with torch.no_grad():
        torch.testing.assert_close(unfold(x), conv(x), rtol=1e-5, atol=1e-5)


def test_stem_init_is_resnets_and_the_rest_is_unchanged():
    model = small(conv_stem=(64, 64))
    conv = model.patch_embed.backbone[3]
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / fan_out), rel=0.05)
    bn = model.patch_embed.backbone[1]
    assert torch.equal(bn.weight, torch.ones(64)) and torch.equal(bn.bias, torch.zeros(64))
    assert model.patch_embed.proj.weight.abs().max().item() <= 0.04  # trunc-normal(0.02)
    assert torch.equal(model.patch_embed.proj.bias, torch.zeros(32))


def test_dynamic_img_size_follows_the_stem():
    model = small(dynamic_img_size=True)
    x = torch.randn(1, 3, 40, 26)  # 40 -> 20 -> 10, 26 -> 13 -> 7: not divisible by 2
    with pytest.raises(ValueError, match="input width 26 gives a 7-pixel conv-stem feature map"):
        model(x)
    with torch.no_grad():
        out, feats = model.forward_intermediates(torch.randn(1, 3, 40, 32), indices=1)
    assert out.shape == (1, 1 + 5 * 4, 32)
    assert feats[0].shape == (1, 32, 5, 4)


def test_bad_conv_stem_values_are_named():
    with pytest.raises(
        ValueError,
        match=r"^conv_stem must be in \[1, 65536\] \(channels per layer\), got \(8, 0\)$",
    ):
        ViTConfig(conv_stem=(8, 0))
    with pytest.raises(TypeError, match=r"^conv_stem must be a list of integers, got \[true\]"):
        ViTConfig(conv_stem=(True,))
    with pytest.raises(TypeError, match=r"^conv_stem must be a list of integers, got 8 \(int\)"):
        ViTConfig(conv_stem=8)
    with pytest.raises(
        ValueError,
        match="img_size height 28 gives a 4-pixel conv-stem feature map, not divisible by "
        "patch_size height 3",
    ):
        create_model("vit_mnist_hybrid", patch_size=3)
    assert ViTConfig(conv_stem=[8, 16]).conv_stem == (8, 16)  # lists (JSON) become tuples


def test_save_and_load_keep_the_batchnorm_statistics(tmp_path):
    model = small().train()
    with torch.no_grad():
        model(torch.randn(8, 3, 30, 30) * 3 + 1)  # moves the running statistics
    model.eval()
    save(model, tmp_path / "m.safetensors")
    loaded = load(tmp_path / "m.safetensors")
    assert loaded.config.conv_stem == (8, 16)
    x = torch.randn(2, 3, 30, 30)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), model(x))
    assert loaded.patch_embed.backbone[1].num_batches_tracked.item() == 1


def test_backbone_reduction_counts_image_pixels_per_token():
    from vitkit import ViTBackbone

    backbone = ViTBackbone(small(), out_indices=(0, 1))
    assert backbone.reductions == [8, 8]  # two stride-2 layers, then 2x2 patches
    with torch.no_grad():
        maps = backbone(torch.randn(1, 3, 30, 30))
    assert [m.shape for m in maps] == [(1, 32, 4, 4)] * 2


def test_formats_without_a_conv_stem_refuse_it():
    from vitkit.convert import timm_kwargs, to_hf_config, to_timm, torchvision_kwargs

    model = small(img_size=32)
    with pytest.raises(ValueError, match="timm's VisionTransformer has no conv stem"):
        to_timm(model)
    with pytest.raises(ValueError, match="timm's VisionTransformer has no conv stem"):
        timm_kwargs(model.config)
    with pytest.raises(ValueError, match="Hugging Face's ViT cannot express this model; .*conv_st"):
        to_hf_config(model.config)
    with pytest.raises(ValueError, match="torchvision's ViT has no conv stem"):
        torchvision_kwargs(model.config)


def test_export_at_the_fixed_size_and_refuse_dynamic_sizes():
    from vitkit.export import export_program

    model = small()
    program = export_program(model, dynamic_batch=False, dynamic_img_size=False)
    x = torch.randn(1, 3, 30, 30)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="a model with a conv_stem exports at its fixed img_size"):
        export_program(model, dynamic_img_size=True)


def test_attention_maps_use_the_stem_grid():
    from vitkit.explain import attention_maps

    maps = attention_maps(small(), torch.randn(2, 3, 30, 30))
    assert maps["rollout"].shape == (2, 4, 4)
    assert maps["cls_attention_heads"].shape == (2, 4, 4, 4)


def test_the_stem_trains_its_batchnorm_and_gets_gradients():
    model = small().train()
    x, y = torch.randn(4, 3, 30, 30), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(model(x), y).backward()
    stem = model.patch_embed.backbone
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in stem.parameters())
    assert isinstance(stem, ConvStem) and stem.out_chans == 16
