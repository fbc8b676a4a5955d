"""timm's model tests through a thin adapter: the checks of timm's tests/test_models.py that
apply to a ViT (forward, backward, default cfg, forward_intermediates, features_only,
TorchScript, torch.fx), run on vitkit models beside timm's model of the same name holding the
same weights, at two blocks 192 wide and 64-pixel images."""

from __future__ import annotations

import math

import pytest
import torch

import vitkit
from _helpers import randomize, requires_timm, requires_torchvision
from vitkit.model.features import FeatureInfo

try:
    import timm
except ImportError:  # every test that runs it is marked requires_timm
    timm = None

# plain; registers (no class token, no_embed_class, avg pool); no class token + MAP pool;
# no_embed_class with a class token (DeiT III); norm_pre (CLIP)
NAMES = [
    "vit_tiny_patch16_224",
    "vit_medium_patch16_reg4_gap_256",
    "vit_base_patch16_siglip_224",
    "deit3_small_patch16_224",
    "vit_base_patch32_clip_224",
]
SMALL = dict(depth=2, img_size=64, embed_dim=192, num_heads=3)
# Measured on random weights: at most 2.4e-6 between vitkit (fused oneDNN kernels) and timm on
# outputs up to 6.8 in magnitude; tolerance 1e-5 + 1e-5 * |x| (5-30x).
TOL = dict(atol=1e-5, rtol=1e-5)


def pair(name: str, **kwargs):
    """vitkit's model and timm's of the same name, both holding vitkit's weights randomised
    (biases, norms and LayerScale far from their initial values: deit3's 1e-6 LayerScale
    would otherwise hide attention and MLP from every comparison)."""
    torch.manual_seed(0)
    ours = randomize(vitkit.create_model(name, **SMALL, **kwargs))
    theirs = timm.create_model(name, pretrained=False, **SMALL, **kwargs)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return ours.eval(), theirs.eval()


def image(batch: int = 1, size: int = 64) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


@requires_timm
@pytest.mark.parametrize("name", NAMES)
def test_model_forward(name):
    ours, theirs = pair(name)
    x = image()
    with torch.no_grad():
        out = ours(x)
        torch.testing.assert_close(out, theirs(x), **TOL)
        assert out.shape[0] == 1 and not out.isnan().any()
        ours.set_grad_checkpointing()
        torch.testing.assert_close(ours(x), out, rtol=1e-4, atol=1e-5)


@requires_timm
@pytest.mark.parametrize("name", NAMES)
def test_model_backward(name):
    ours, theirs = pair(name, num_classes=42)
    ours.train(), theirs.train()
    x = image(2)
    ours(x).mean().backward()
    theirs(x).mean().backward()
    grads = dict(theirs.named_parameters())
    for key, param in ours.named_parameters():
        assert param.grad is not None, f"no gradient for {key}"
        torch.testing.assert_close(param.grad, grads[key].grad, atol=1e-5, rtol=1e-4)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert ours(x).shape == (2, 42)


@requires_timm
@pytest.mark.parametrize("name", NAMES)
def test_model_default_cfg_attributes_and_heads(name):
    ours, theirs = pair(name)
    for attr in ("num_classes", "num_features", "head_hidden_size", "num_prefix_tokens"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ours.no_weight_decay() <= theirs.no_weight_decay()
    assert ours.group_matcher() == theirs.group_matcher() | {
        "stem": r"^cls_token|dist_token|reg_token|pos_embed|patch_embed|norm_pre"
    }
    cfg, state = ours.default_cfg, ours.state_dict()
    for key in ("first_conv", "classifier", "fixed_input_size", "pool_size"):
        assert cfg[key] == theirs.pretrained_cfg[key], key
    assert cfg["first_conv"] + ".weight" in state
    assert not cfg["num_classes"] or cfg["classifier"] + ".weight" in state
    assert timm.data.resolve_data_config(model=ours)["input_size"] == (3, 64, 64)
    x = image()
    with torch.no_grad():
        feats = ours.forward_features(x)
        torch.testing.assert_close(feats, theirs.forward_features(x), **TOL)
        pre = ours.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pre, theirs.forward_head(feats, pre_logits=True), **TOL)
        assert pre.shape == (1, ours.head_hidden_size)
        ours.reset_classifier(0), theirs.reset_classifier(0)
        assert ours.num_classes == 0
        torch.testing.assert_close(ours(x), pre, rtol=0, atol=0)
        ours.reset_classifier(0, ""), theirs.reset_classifier(0, "")
        tokens = ours(x)
        patches = ours.patch_embed.num_patches
        assert tokens.shape == (1, ours.num_prefix_tokens + patches, ours.num_features)
        torch.testing.assert_close(tokens, theirs(x), **TOL)
    unpooled = vitkit.create_model(name, num_classes=0, global_pool="", **SMALL)
    assert unpooled.global_pool == "none" and unpooled(x).shape == tokens.shape


@requires_timm
def test_pretrained_cfg_is_timms_vit_default_or_the_loaded_data_config():
    ours, theirs = pair("vit_tiny_patch16_224")
    keys = ("interpolation", "crop_pct", "crop_mode", "mean", "std")
    assert {k: ours.pretrained_cfg[k] for k in keys} == {k: theirs.pretrained_cfg[k] for k in keys}
    from vitkit.data.data_config import DataConfig

    ours.data_config = DataConfig(
        input_size=(3, 64, 64), mean=(0.1,) * 3, std=(0.2,) * 3, interpolation="bilinear"
    )
    assert ours.pretrained_cfg["mean"] == (0.1,) * 3
    assert ours.pretrained_cfg["interpolation"] == "bilinear"
    ours.pretrained_cfg = {"mean": (0.3,)}
    assert ours.default_cfg == {"mean": (0.3,)}


@requires_timm
@pytest.mark.parametrize("name", NAMES)
def test_model_forward_intermediates(name):
    ours, theirs = pair(name)
    assert ours.feature_info == theirs.feature_info
    info = FeatureInfo(ours.feature_info, len(ours.feature_info))
    reference = timm.models.FeatureInfo(theirs.feature_info, len(theirs.feature_info))
    assert info.channels() == reference.channels() and len(info.channels()) == 2
    assert info.reduction() == reference.reduction()
    x = image()
    with torch.no_grad():
        final, maps = ours.forward_intermediates(x)
        their_final, their_maps = theirs.forward_intermediates(x)
        torch.testing.assert_close(final, their_final, **TOL)
        torch.testing.assert_close(final, ours.forward_features(x), rtol=0, atol=0)
        for got, want, chans, red in zip(maps, their_maps, info.channels(), info.reduction()):
            assert got.shape == (1, chans, math.ceil(64 / red), math.ceil(64 / red))
            torch.testing.assert_close(got, want, **TOL)
        for options in (
            dict(indices=1, norm=True, output_fmt="NLC"),
            dict(indices=[0, -1], return_prefix_tokens=True),
        ):
            got = ours.forward_intermediates(x, intermediates_only=True, **options)
            want = theirs.forward_intermediates(x, intermediates_only=True, **options)
            if ours.num_prefix_tokens == 0 and options.get("return_prefix_tokens"):
                # vitkit always pairs (maps, prefix); timm gives bare maps without prefix tokens
                assert all(prefix.shape == (1, 0, ours.embed_dim) for _, prefix in got)
                got = [maps for maps, _ in got]
            torch.testing.assert_close(got, want, **TOL)
        ours.set_grad_checkpointing()
        again, _ = ours.forward_intermediates(x)
        torch.testing.assert_close(again, final, rtol=1e-4, atol=1e-5)


@requires_timm
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("out_indices", [(0, 1), (-1,), 1])
def test_model_features_only(name, out_indices):
    torch.manual_seed(0)
    options = dict(features_only=True, out_indices=out_indices, **SMALL)
    ours = randomize(vitkit.create_model(name, **options))
    theirs = timm.create_model(name, pretrained=False, **options).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)  # pruned alike
    assert ours.feature_info.get_dicts() == theirs.feature_info.get_dicts()
    assert ours.feature_info.out_indices == theirs.feature_info.out_indices
    for accessor in ("channels", "reduction", "module_name"):
        assert getattr(ours.feature_info, accessor)() == getattr(theirs.feature_info, accessor)()
        assert getattr(ours.feature_info, accessor)(0) == getattr(theirs.feature_info, accessor)(0)
    assert ours.pretrained_cfg.keys() <= theirs.pretrained_cfg.keys() | {"fixed_input_size"}
    x = image()
    with torch.no_grad():
        maps = ours(x)
        want = theirs(x)
        assert len(maps) == len(ours.feature_info.channels())
        torch.testing.assert_close(maps, want, **TOL)
        tokens = vitkit.create_model(name, **options, output_fmt="NLC").eval()
        tokens.load_state_dict(ours.state_dict())
        patches = tokens.model.patch_embed.num_patches
        assert [t.shape for t in tokens(x)] == [(1, patches, m.shape[1]) for m in maps]


def test_features_only_refuses_other_wrappers_and_stray_options():
    with pytest.raises(ValueError, match=r"feature_cls='hook' is not available for a ViT"):
        vitkit.create_model("vit_tiny_patch16_224", features_only=True, feature_cls="hook")
    with pytest.raises(ValueError, match=r"pass features_only=True with them"):
        vitkit.create_model("vit_tiny_patch16_224", out_indices=(0, 1))
    with pytest.raises(ValueError, match=r"output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"):
        vitkit.create_model("vit_tiny_patch16_224", features_only=True, output_fmt="NHWC", **SMALL)


@requires_timm
@pytest.mark.parametrize("indices,prune_norm", [([0], False), (1, True), ([-2], True)])
def test_prune_intermediate_layers(indices, prune_norm):
    ours, theirs = pair("vit_medium_patch16_reg4_gap_256")
    kept = ours.prune_intermediate_layers(indices, prune_norm=prune_norm)
    assert kept == theirs.prune_intermediate_layers(indices, prune_norm=prune_norm)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert ours.config.depth == len(ours.blocks) == len(theirs.blocks)
    rebuilt = vitkit.VisionTransformer(ours.config)  # the config follows the pruning
    rebuilt.load_state_dict(ours.state_dict(), strict=True)
    x = image()
    with torch.no_grad():
        got = ours.forward_intermediates(x, kept, norm=not prune_norm)
        want = theirs.forward_intermediates(x, kept, norm=not prune_norm)
    torch.testing.assert_close(got, want, **TOL)


@requires_timm
@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit3_small_patch16_224"])
@pytest.mark.parametrize("img_size,patch_size", [((48, 80), None), (96, 8)])
def test_set_input_size(name, img_size, patch_size):
    ours, theirs = pair(name)
    ours.set_input_size(img_size=img_size, patch_size=patch_size)
    theirs.set_input_size(img_size=img_size, patch_size=patch_size)
    want = theirs.state_dict()
    # measured 6e-7 (resampled weights) and 2.4e-6 (logits up to 3); tolerance TOL
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(value, want[key], **TOL, msg=key)
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    x = torch.randn(1, 3, height, width)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), **TOL)
    assert ours.pretrained_cfg["input_size"] == (3, height, width)
    assert [info["reduction"] for info in ours.feature_info] == [patch_size or 16] * 2


@requires_timm
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", NAMES)
def test_model_forward_torchscript(name):
    """As timm's own test: script the model as built (CPU fast path on), nothing called first;
    the scripted model runs the plain path, the eager one its fused kernels."""
    ours, _ = pair(name)
    classes = [type(m) for m in ours.modules()]
    fast = ours.fast_path_in_use()
    x = image()
    scripted = torch.jit.script(ours)
    with torch.no_grad():  # measured 1.3e-6 on logits up to 3 (plain against fused kernels)
        torch.testing.assert_close(scripted(x), ours(x), rtol=0, atol=1e-5)
    assert [type(m) for m in ours.modules()] == classes and ours.fast_path_in_use() == fast


@requires_timm
@requires_torchvision
@pytest.mark.parametrize("name", NAMES)
def test_model_forward_fx(name):
    from torchvision.models.feature_extraction import (
        create_feature_extractor,
        get_graph_node_names,
    )

    ours, _ = pair(name)
    classes = [type(m) for m in ours.modules()]
    x = image()
    with torch.inference_mode():
        eager = ours(x)
        traced_model = torch.fx.symbolic_trace(ours)
        traced = traced_model(x)
        assert torch.all(traced == eager)  # as timm's: the graph calls the same fast layers
        train_nodes, eval_nodes = get_graph_node_names(ours)
        extractor = create_feature_extractor(
            ours, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]]
        )
        (features,) = extractor(x).values()
        assert torch.equal(features, traced)
        ours.set_fast_path(False)  # the graph calls the model's blocks: it follows the switch
        assert torch.equal(traced_model(x), ours(x))
    assert [type(m) for m in ours.modules()] == classes


@requires_timm
def test_model_backward_fx():
    ours, _ = pair("vit_tiny_patch16_224", num_classes=42)
    traced = torch.fx.symbolic_trace(ours.train())
    out = traced(image(2))
    out.mean().backward()
    assert out.shape == (2, 42)
    assert all(p.grad is not None for p in traced.parameters())


@requires_timm
def test_prune_intermediate_layers_of_a_distilled_model_matches_timm():
    """A distilled model prunes like timm's: heads gone, the pooling kept (it used to raise
    'distilled=True needs global_pool='token'')."""
    model = randomize(
        vitkit.create_model("deit_tiny_patch16_224", distilled=True, depth=3, img_size=64)
    )
    theirs = timm.create_model("deit_tiny_distilled_patch16_224", depth=3, img_size=64)
    theirs.load_state_dict(model.state_dict())
    assert model.prune_intermediate_layers([1]) == theirs.prune_intermediate_layers([1])
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), theirs.eval()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, mean",
    [
        ("vit_tiny_patch16_224", (0.5, 0.5, 0.5)),
        ("swin_tiny_patch4_window7_224", (0.485, 0.456, 0.406)),
        ("eva02_tiny_patch14_224", (0.48145466, 0.4578275, 0.40821073)),
    ],
)
def test_every_family_answers_timms_pretrained_cfg_as_timm(name, mean):
    """One `pretrained_cfg` for every family (model/timm_cfg.py) with each family's timm
    default, read by timm's own `resolve_data_config`; a cfg set by timm is kept as set."""
    import timm.data

    model = vitkit.create_model(name, pretrained=False, num_classes=3)
    ours = timm.data.resolve_data_config(model=model)
    theirs = timm.data.resolve_data_config(model=timm.create_model(name, num_classes=3))
    assert ours == theirs and ours["mean"] == mean
    assert (
        model.pretrained_cfg["classifier"] == timm.create_model(name).pretrained_cfg["classifier"]
    )
    model.pretrained_cfg = {"input_size": (3, 32, 32)}
    assert model.default_cfg == {"input_size": (3, 32, 32)}
