"""timm converter: parity with timm's models, config inference, round trips through timm's
layout, and `vitkit convert --from timm`."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from _helpers import requires_timm
from vitkit import CheckpointError, VisionTransformer, convert
from vitkit.cli import main
from vitkit.weights import MissingOptionError

TIMM_CASES = [
    pytest.param("vit_tiny_patch16_224", {}, id="tiny"),
    pytest.param("vit_small_patch16_224", {}, id="small", marks=pytest.mark.slow),
    pytest.param("vit_base_patch16_224", {}, id="base", marks=pytest.mark.slow),
    pytest.param(
        "vit_tiny_patch16_224",
        {"class_token": False, "global_pool": "avg", "patch_size": 32},
        id="tiny-avg-nocls-patch32",
    ),
    pytest.param("deit_tiny_distilled_patch16_224", {}, id="deit-distilled"),
]


@pytest.mark.parametrize("name, kwargs", TIMM_CASES)
def test_timm_parity(name, kwargs):
    timm = pytest.importorskip("timm", reason="timm not installed (pip install -e '.[interop]')")
    source = randomize(timm.create_model(name, pretrained=False, **kwargs))
    state_dict, config = convert.from_timm(source.state_dict())
    assert (config.embed_dim, config.depth, config.num_heads) == (
        source.embed_dim,
        len(source.blocks),
        source.blocks[0].attn.num_heads,
    )
    assert config.patch_size == source.patch_embed.patch_size[0]
    assert config.class_token == (source.cls_token is not None)
    assert config.global_pool == source.global_pool
    assert config.num_classes == 1000
    model = vitkit.load_pretrained(source.state_dict())
    assert not model.training
    x = images(224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


def test_timm_heads_override_and_default():
    sd = VisionTransformer(embed_dim=64, depth=1, num_heads=2, img_size=32, patch_size=8)
    with pytest.raises(
        MissingOptionError, match=r"width 64 is not a standard .*; pass num_heads=N$"
    ):
        convert.from_timm(sd.state_dict())  # width 64: refused, never guessed
    assert convert.from_timm(sd.state_dict(), num_heads=2)[1].num_heads == 2
    assert convert.default_num_heads(1024) == 16
    assert convert.default_num_heads(1280) == 16
    with pytest.raises(CheckpointError, match="width 320 is not a standard ViT size"):
        convert.default_num_heads(320)


@requires_timm
def test_timm_differential_attention_converts_with_timms_output():
    import timm

    torch.manual_seed(0)
    source = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, attn_layer="diff"
    ).eval()
    state_dict, config = convert.from_timm(source.state_dict(), num_heads=2, img_size=32)
    assert config.attn_layer == "diff"
    model = VisionTransformer(config).eval()
    model.load_state_dict(state_dict)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=1e-5, atol=1e-5)


# (model options, what the weights cannot show and the caller states)
ROUND_TRIP_CONFIGS = [
    pytest.param(dict(), {}, id="default"),
    pytest.param(dict(class_token=False, global_pool="avg"), {}, id="avg"),
    pytest.param(dict(distilled=True), {}, id="distilled"),
    # LayerScale's init value is not in the weights: converters record 1e-5.
    pytest.param(dict(init_values=1e-5, embed_norm=True, qkv_bias=False), {}, id="layerscale"),
    # Mean pooling after the final norm looks like token pooling in the weights.
    pytest.param(
        dict(global_pool="avg", fc_norm=False, mlp_ratio=2.0),
        dict(global_pool="avg", fc_norm=False),
        id="avg-final-norm",
    ),
    pytest.param(
        dict(in_chans=1, patch_size=4, img_size=(16, 32)), dict(img_size=(16, 32)), id="non-square"
    ),
]


@pytest.mark.parametrize("options, hints", ROUND_TRIP_CONFIGS)
def test_round_trip_vitkit_timm_vitkit(options, hints):
    base = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)
    model = randomize(VisionTransformer(**{**base, **options}))
    exported = convert.to_timm(model)
    back, config = convert.from_timm(exported, num_heads=4, **hints)
    assert config == model.config
    assert back.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(back[key], value), key

    timm = pytest.importorskip("timm", reason="timm not installed")
    source = convert.source_model("timm", model.config, exported)
    assert isinstance(source, timm.models.vision_transformer.VisionTransformer)
    x = images(model.config.img_size, batch=2, chans=model.config.in_chans)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


def test_to_timm_writes_fixed_tables_and_unfold_weights():
    model = randomize(
        VisionTransformer(
            img_size=32,
            patch_size=8,
            embed_dim=64,
            depth=1,
            num_heads=4,
            pos_embed="sincos2d",
            patch_embed="unfold",
        )
    )
    exported = convert.to_timm(model)
    assert exported["patch_embed.proj.weight"].shape == (64, 3, 8, 8)
    assert exported["pos_embed"].shape == (1, 17, 64)
    back, config = convert.from_timm(exported, num_heads=4)
    assert config.pos_embed == "learn" and config.patch_embed == "conv"
    twin = vitkit.load_pretrained(back, num_heads=4)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), **TOL)


def test_cli_convert_timm_without_a_name_checks_the_mapping_only(tmp_path, capsys):
    """vitkit weights in timm's layout name no timm model: timm's VisionTransformer of vitkit's
    inferred config checks the key mapping, and the line names what the weights do not record
    (the head count was given)."""
    pytest.importorskip("timm", reason="timm not installed")
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    torch.save({"model": convert.to_timm(source)}, tmp_path / "in.pth")
    out = tmp_path / "out.safetensors"
    code = main(
        ["convert", "--from", "timm", str(tmp_path / "in.pth"), str(out), "--num-heads", "4"]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "converted 32 tensors: embed_dim 64, depth 2, heads 4" in text
    line = text.splitlines()[-1]
    assert line.startswith(
        "parity: checked the key mapping only, against timm's VisionTransformer built from "
        "vitkit's inferred config: max |difference| "
    )
    assert line.endswith(
        " over the logits and tokens of a random batch of 2 (within tolerance 1e-04); the "
        "weights do not record the activation (exact GELU assumed), the norm epsilon (1e-06 "
        "assumed), the block order (pre-norm assumed) and the pooling ('token' assumed): pass "
        "--arch NAME to check against timm"
    )
    loaded = vitkit.load(out)
    assert loaded.meta["converted_from"] == "timm"
    assert loaded.data_config.to_dict() == {  # timm's ViT defaults: a bare file has no config
        "input_size": [3, 32, 32],
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "interpolation": "bicubic",
        "crop_pct": 0.9,
        "crop_mode": "center",
    }
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), source(x), **TOL)


def test_cli_convert_headless_timm_checks_the_mapping(tmp_path, capsys):
    """A headless model's mapping check compares pooled features (timm's num_classes=0 output)
    and tokens; it used to compare vitkit's tokens with them and fail with a shape error."""
    pytest.importorskip("timm", reason="timm not installed")
    source = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2,
                                         num_heads=4, num_classes=0))  # fmt: skip
    torch.save(convert.to_timm(source), tmp_path / "in.pth")
    out = tmp_path / "out.safetensors"
    code = main(
        ["convert", "--from", "timm", str(tmp_path / "in.pth"), str(out), "--num-heads", "4"]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "0 classes" in text
    assert " over the pooled features and tokens of a random batch of 2 (within tolerance" in text


def test_check_parity_in_python(tmp_path):
    """`convert.check_parity`: the named timm model, the mapping only without a name, and a
    line that writes the options as Python."""
    timm = pytest.importorskip("timm", reason="timm not installed")
    source = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1,
                                         img_size=32, num_classes=3))  # fmt: skip
    torch.save(source.state_dict(), tmp_path / "w.pth")
    model = vitkit.load_pretrained(tmp_path / "w.pth")
    named = convert.check_parity(model, tmp_path / "w.pth", "timm", arch="vit_tiny_patch16_224")
    assert named.ok and named.scope == "function" and not named.assumed
    assert named.reference == "timm vit_tiny_patch16_224 (depth=1, num_classes=3, img_size=32)"
    assert named.difference <= 1e-5 and named.compared == ("logits", "tokens")
    loose = convert.check_parity(model, tmp_path / "w.pth", "timm", arch="vit_tiny_patch16_224",
                                 tolerance=1e-3)  # fmt: skip
    assert loose.line().endswith(" of a random batch of 2 (ok, tolerance 1e-03)")
    unnamed = convert.check_parity(model, tmp_path / "w.pth", "timm")
    assert (unnamed.scope, unnamed.ok, unnamed.failed) == ("mapping", False, False)
    assert unnamed.line().endswith(": pass arch='<timm model name>' to check against timm")
