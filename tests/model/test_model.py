"""VisionTransformer: shapes, pooling, init, dynamic size, bad input, autocast and compile."""

import pytest
import torch
from torch import nn

from _helpers import randomize
from vitkit import VisionTransformer, ViTConfig, create_model
from vitkit.model.layers import conv_to_unfold_weight

TINY = dict(
    img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4
)


def tiny(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**TINY, **overrides})


def test_shapes_at_each_step_for_vit_b16():
    model = create_model("vit_base_patch16_224", depth=1).eval()
    x = torch.randn(2, 3, 224, 224)
    tokens, grid = model.patch_embed(x)
    assert tokens.shape == (2, 196, 768) and grid == (14, 14)
    assert model.embed(x).shape == (2, 197, 768)
    feats = model.forward_features(x)
    assert feats.shape == (2, 197, 768)
    assert model.forward_head(feats).shape == (2, 1000)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 768)


def test_non_square_image_and_patches():
    model = tiny(img_size=(60, 100), patch_size=20)
    assert model.patch_embed.num_patches == 15
    assert model.pos_embed.shape == (1, 16, 32)
    assert model.forward_features(torch.randn(1, 3, 60, 100)).shape == (1, 16, 32)
    model = tiny(img_size=(12, 32), patch_size=(4, 8))
    assert model.patch_embed.grid_size == (3, 4)
    assert model(torch.randn(2, 3, 12, 32)).shape == (2, 5)


def test_forward_is_features_then_head():
    model = tiny().eval()
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)))


def test_class_token_pool_reads_token_zero():
    model = tiny().eval()
    feats = model.forward_features(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(model.forward_head(feats), model.head(feats[:, 0]))


def test_avg_pool_without_class_token_uses_fc_norm():
    model = tiny(class_token=False, global_pool="avg").eval()
    assert model.cls_token is None and model.num_prefix_tokens == 0
    assert isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.LayerNorm)
    feats = model.forward_features(torch.randn(2, 3, 16, 16))
    assert feats.shape == (2, 16, 32)
    torch.testing.assert_close(model.forward_head(feats), model.head(model.fc_norm(feats.mean(1))))


def test_avg_pool_with_class_token_skips_it():
    model = tiny(global_pool="avg", fc_norm=False).eval()
    feats = model.forward_features(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(model.forward_head(feats), model.head(feats[:, 1:].mean(1)))


def test_num_classes_zero_gives_features_and_one_gives_regression():
    assert tiny(num_classes=0)(torch.randn(2, 3, 16, 16)).shape == (2, 32)
    assert isinstance(tiny(num_classes=0).head, nn.Identity)
    assert tiny(num_classes=1)(torch.randn(2, 3, 16, 16)).shape == (2, 1)


@pytest.mark.parametrize("kind", ["learn", "sinusoid", "sincos2d", "none"])
def test_position_embedding_kinds(kind):
    model = tiny(pos_embed=kind).eval()
    x = torch.randn(1, 3, 16, 16)
    tokens, _ = model.patch_embed(x)
    prefix = model.cls_token.expand(1, -1, -1)
    expected = torch.cat([prefix, tokens], 1)
    if kind != "none":
        expected = expected + model.pos_embed
    torch.testing.assert_close(model.embed(x), expected)
    assert ("pos_embed" in dict(model.named_parameters())) == (kind == "learn")


def test_unfold_model_equals_conv_model():
    conv = randomize(tiny())
    unfold = tiny(patch_embed="unfold").eval()
    state = conv.state_dict()
    state["patch_embed.proj.weight"] = conv_to_unfold_weight(state["patch_embed.proj.weight"])
    unfold.load_state_dict(state)
    x = torch.randn(2, 3, 16, 16)
    # measured 1.2e-7 on logits up to 0.43 (a GEMM against a convolution); tolerance 1e-5
    torch.testing.assert_close(unfold(x), conv(x), atol=1e-5, rtol=0)


def test_initialisation():
    torch.manual_seed(0)
    model = create_model("vit_small_patch16_224", depth=2)
    linear_weights = torch.cat(
        [m.weight.flatten() for m in model.modules() if isinstance(m, nn.Linear)]
    )
    assert linear_weights.std().item() == pytest.approx(
        0.02 * 0.88, rel=0.02
    )  # std of N(0,.02) cut at 2 std
    assert linear_weights.abs().max().item() <= 0.04
    assert all(torch.all(m.bias == 0) for m in model.modules() if isinstance(m, nn.Linear))
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert all(torch.all(n.weight == 1) and torch.all(n.bias == 0) for n in norms)
    assert model.patch_embed.proj.weight.std().item() == pytest.approx(0.02 * 0.88, rel=0.05)
    assert torch.all(model.patch_embed.proj.bias == 0)
    for token in (model.cls_token, model.pos_embed):
        assert token.std().item() == pytest.approx(0.02 * 0.88, rel=0.1)
    zeros = tiny(token_init="zeros")
    assert torch.all(zeros.cls_token == 0) and torch.all(zeros.pos_embed == 0)


def test_no_weight_decay_names():
    assert tiny().no_weight_decay() == {"pos_embed", "cls_token"}
    assert tiny(distilled=True).no_weight_decay() == {"pos_embed", "cls_token", "dist_token"}
    assert (
        tiny(class_token=False, global_pool="avg", pos_embed="sincos2d").no_weight_decay() == set()
    )


def test_stochastic_depth_rises_linearly():
    model = tiny(depth=5, drop_path_rate=0.2)
    rates = [
        block.drop_path1.p if hasattr(block.drop_path1, "p") else 0.0 for block in model.blocks
    ]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_dropout_placement_follows_appendix_b1():
    model = tiny(drop_rate=0.1, attn_drop_rate=0.2)
    block = model.blocks[0]
    assert model.pos_drop.p == 0.1
    assert block.attn.attn_drop.p == 0.2 and block.attn.proj_drop.p == 0.1
    assert block.mlp.drop1.p == 0.1 and block.mlp.drop2.p == 0.1
    # no dropout module sits on the qkv projection's output path
    assert not any(isinstance(m, nn.Dropout) for m in block.attn.qkv.modules())


def test_distilled_model_averages_heads():
    model = tiny(distilled=True).eval()
    assert model.num_prefix_tokens == 2 and model.pos_embed.shape == (1, 18, 32)
    x = torch.randn(2, 3, 16, 16)
    cls_logits, dist_logits = model.forward_distill(x)
    torch.testing.assert_close(model(x), (cls_logits + dist_logits) / 2)


def test_reset_classifier():
    model = tiny()
    model.reset_classifier(7)
    assert model.head.out_features == 7 and model.config.num_classes == 7
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 7)


def test_return_attention():
    model = randomize(tiny(init_values=1e-5))
    x = torch.randn(2, 3, 16, 16)
    logits, attentions = model(x, return_attention=True)
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 17, 17)


def test_dynamic_img_size_at_native_size_equals_fixed_path():
    fixed = tiny().eval()
    dynamic = tiny(dynamic_img_size=True).eval()
    dynamic.load_state_dict(fixed.state_dict())
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(dynamic(x), fixed(x))


def test_dynamic_img_size_resamples_learned_grid():
    from vitkit.model.layers.pos_embed import resample_pos_embed

    model = tiny(dynamic_img_size=True).eval()
    x = torch.randn(1, 3, 24, 12)
    expected_pos = resample_pos_embed(model.pos_embed, (6, 3), old_size=(4, 4))
    tokens, _ = model.patch_embed(x)
    expected = torch.cat([model.cls_token, tokens], 1) + expected_pos
    torch.testing.assert_close(model.embed(x), expected)
    assert model(x).shape == (1, 5)


@pytest.mark.parametrize("kind", ["sinusoid", "sincos2d"])
def test_dynamic_img_size_recomputes_fixed_tables(kind):
    from vitkit.model.layers.pos_embed import fixed_pos_embed

    model = tiny(dynamic_img_size=True, pos_embed=kind).eval()
    x = torch.randn(1, 3, 8, 20)
    tokens, _ = model.patch_embed(x)
    expected = torch.cat([model.cls_token, tokens], 1) + fixed_pos_embed(kind, (2, 5), 32, 1)
    torch.testing.assert_close(model.embed(x), expected)


def test_grad_checkpointing_gives_the_same_gradients():
    model = tiny().train()
    x = torch.randn(2, 3, 16, 16)
    model(x).sum().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, plain[name], atol=1e-6, rtol=1e-5)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, error, message",
    [
        (
            torch.randn(2, 3, 16, 20),
            ValueError,
            r"input size 16x20 differs from the model's img_size 16x16; .*dynamic_img_size=True",
        ),
        (torch.randn(2, 1, 16, 16), ValueError, r"expected 3 input channels, got 1 .*in_chans=1"),
        (
            torch.randn(3, 16, 16),
            ValueError,
            r"expected a 4-D input \(B, C, H, W\), got 3-D .*unsqueeze\(0\)",
        ),
        (torch.randn(1, 1, 3, 16, 16), ValueError, r"expected a 4-D input \(B, C, H, W\), got 5-D"),
        (
            torch.zeros(1, 3, 16, 16, dtype=torch.uint8),
            TypeError,
            r"floating-point input, got torch.uint8; convert with x.float\(\) / 255",
        ),
        ([[1.0]], TypeError, r"expected a torch.Tensor of shape \(B, C, H, W\), got list"),
    ],
)
def test_bad_input_is_named(x, error, message):
    with pytest.raises(error, match=message):
        tiny()(x)


def test_dynamic_size_not_divisible_by_patch():
    with pytest.raises(
        ValueError,
        match="input width 18 is not divisible by patch size 4; resize to a multiple of 4",
    ):
        tiny(dynamic_img_size=True)(torch.randn(1, 3, 16, 18))


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            dict(img_size=225, patch_size=16),
            ValueError,
            "img_size height 225 is not divisible by patch_size height 16",
        ),
        (
            dict(img_size=(60, 100), patch_size=(20, 30)),
            ValueError,
            "img_size width 100 is not divisible by patch_size width 30",
        ),
        (
            dict(embed_dim=100, num_heads=3),
            ValueError,
            "embed_dim 100 is not divisible by num_heads 3",
        ),
        (
            dict(global_pool="gem"),
            ValueError,
            "unknown global_pool 'gem'; expected one of 'token', 'avg', 'avgmax', 'max', 'map', "
            "'none'",
        ),
        (
            dict(pos_embed="rope"),
            ValueError,
            "unknown pos_embed 'rope'; expected one of 'learn', 'sinusoid', 'sincos2d', 'none'",
        ),
        (
            dict(patch_embed="linear"),
            ValueError,
            "unknown patch_embed 'linear'; expected one of 'conv', 'unfold'",
        ),
        (
            dict(encoder="jax"),
            ValueError,
            "unknown encoder 'jax'; expected one of 'native', 'torch'",
        ),
        (
            dict(class_token=False),
            ValueError,
            "global_pool='token' needs class_token=True; use global_pool='avg'",
        ),
        (dict(depth=0), ValueError, r"depth must be in \[1, 1024\], got 0"),
        (dict(drop_rate=1.5), ValueError, r"drop_rate must be in \[0, 1\), got 1.5"),
        (dict(embed_dim="768"), TypeError, r'embed_dim must be an integer, got "768" \(str\)'),
        (dict(qkv_bias=1), TypeError, r"qkv_bias must be true or false, got 1 \(int\)"),
        (dict(depth=True), TypeError, r"depth must be an integer, got true \(bool\)"),
        (dict(num_head=4), TypeError, r"unknown model option 'num_head' \(did you mean num_heads"),
    ],
)
def test_bad_options_are_named(options, error, message):
    with pytest.raises(error, match=message):
        VisionTransformer(**{**TINY, **options})


def test_config_round_trips_through_json():
    import json

    config = ViTConfig(img_size=(60, 100), patch_size=20, pos_embed="sincos2d")
    again = ViTConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.img_size == (60, 100)


# -- precision and compilation ----------------------------------------------------------------


def test_bf16_autocast_on_cpu():
    model = randomize(tiny(init_values=0.1))
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert out.dtype == torch.bfloat16
    want = model(x)
    assert want.abs().max() > 0.3  # random weights: logits far from zero
    # measured 1.9e-3 on logits up to 0.47 (bf16 products, float32 softmax and norms);
    # tolerance 1e-2 (5x)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=0)


@pytest.mark.slow
def test_torch_compile_matches_eager():
    model = tiny().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"norm_eps": -1.0}, "norm_eps must be > 0, got -1.0"),
        ({"qk_scale": float("nan")}, "qk_scale must be a finite number > 0, got nan"),
        ({"mlp_ratio": float("inf")}, "mlp_ratio must be a finite number > 0, got inf"),
        ({"mlp_ratio": 0.001}, "mlp_ratio 0.001 gives an MLP of width 0 for embed_dim 64"),
        ({"init_values": float("nan")}, "init_values must be a finite number >= 0 (0 or None"),
        ({"drop_rate": float("nan")}, "drop_rate must be a finite number in [0, 1), got nan"),
    ],
)
def test_numbers_that_would_give_a_broken_model_are_refused(options, message):
    from vitkit import create_model

    with pytest.raises(ValueError) as err:
        create_model("vit_digits", **options)
    assert str(err.value).startswith(message)
