"""Converters: parity with timm, Hugging Face, torchvision and the JAX layout; round trips;
position-embedding resampling; config inference; the `vitkit convert` command."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from vitkit import CheckpointError, VisionTransformer, convert
from vitkit.cli import main

# 1e-5 absolute, with torch.allclose's default 1e-5 relative term: vitkit's fused inference
# kernels sum in another order than the reference library, which moves ViT-B logits of
# magnitude ~3 by about 1e-5 (float32 rounding, not a conversion difference).
TOL = dict(atol=1e-5, rtol=1e-5)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter so that no zero-initialised head or unit norm hides a mistake."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


def images(size: int | tuple[int, int], batch: int = 1, chans: int = 3) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, chans, h, w, generator=torch.Generator().manual_seed(1))


# -- timm ----------------------------------------------------------------------------------

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
    assert convert.from_timm(sd.state_dict())[1].num_heads == 1  # 64 // 64
    assert convert.from_timm(sd.state_dict(), num_heads=2)[1].num_heads == 2
    assert convert.default_num_heads(1024) == 16
    assert convert.default_num_heads(1280) == 16
    assert convert.default_num_heads(320) == 5


def test_timm_unsupported_layer_is_reported():
    timm = pytest.importorskip("timm", reason="timm not installed")
    source = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, reg_tokens=2
    )
    with pytest.raises(CheckpointError, match=r"register tokens \(reg_token\), which vitkit"):
        convert.from_timm(source.state_dict())


def test_resample_224_to_384_matches_timm():
    timm = pytest.importorskip("timm", reason="timm not installed")
    from timm.layers import resample_abs_pos_embed
    from timm.models.vision_transformer import checkpoint_filter_fn

    source = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    sd = source.state_dict()
    model = vitkit.load_pretrained(sd, img_size=384)
    expected = resample_abs_pos_embed(sd["pos_embed"], new_size=(24, 24), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, **TOL)
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)

    big = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=384).eval()
    big.load_state_dict(checkpoint_filter_fn(sd, big))
    x = images(384)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, 1000)
        torch.testing.assert_close(out, big(x), **TOL)


def test_new_num_classes_reinitialises_only_the_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    model = vitkit.load_pretrained(source.state_dict(), num_classes=7, num_heads=4)
    assert model.head.weight.shape == (7, 64)
    assert model.config.num_classes == 7
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            assert torch.equal(model.state_dict()[key], value), key


def test_load_into_given_model_with_other_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    target = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=3
    )
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    assert model is target and model.head.weight.shape == (3, 64)
    assert torch.equal(model.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)


def test_load_into_given_model_at_another_resolution():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4)
    )
    target = VisionTransformer(img_size=(48, 64), patch_size=8, embed_dim=64, depth=1, num_heads=4)
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    expected = vitkit.model.pos_embed.resample_pos_embed(source.pos_embed, new_size=(6, 8))
    assert torch.equal(model.pos_embed.detach(), expected.detach())
    assert model(images((48, 64))).shape == (1, 1000)
    with pytest.raises(ValueError, match=r"img_size= applies when load_pretrained builds"):
        vitkit.load_pretrained(source.state_dict(), model=target, img_size=64)


def test_load_into_wrong_model_gives_readable_report():
    source = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    target = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=4)
    with pytest.raises(CheckpointError, match=r"missing: blocks\.2\.attn\.proj\.bias"):
        vitkit.load_pretrained(source.state_dict(), model=target)


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


# -- Hugging Face --------------------------------------------------------------------------


def hf_config(**kw):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    base = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    return transformers.ViTConfig(**{**base, **kw})


def test_hf_parity_with_config():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config()
    source = randomize(transformers.ViTForImageClassification(cfg))
    sd, config = convert.from_hf(source.state_dict(), config=cfg)
    assert (config.embed_dim, config.depth, config.num_heads, config.num_classes) == (64, 2, 4, 5)
    assert config.norm_eps == 1e-12 and config.mlp_ratio == 2.0
    model = vitkit.load_pretrained(source.state_dict(), config=cfg)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_hf_parity_without_config_uses_hf_defaults():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(hidden_size=192, num_attention_heads=3, intermediate_size=768, image_size=48)
    source = randomize(transformers.ViTForImageClassification(cfg))
    sd, config = convert.from_hf(source.state_dict())
    assert config.num_heads == 3 and config.norm_eps == 1e-12 and config.img_size == 48
    model = vitkit.load_pretrained(source.state_dict())
    x = images(48, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_hf_vitmodel_with_pooler_and_saved_folder(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(num_attention_heads=2, layer_norm_eps=1e-6)
    source = randomize(transformers.ViTModel(cfg))  # with the pooler: dropped on conversion
    sd, config = convert.from_hf(source.state_dict(), config=cfg)
    assert config.num_classes == 0 and config.num_heads == 2 and config.norm_eps == 1e-6
    model = vitkit.load_pretrained(source.state_dict(), config=cfg)
    x = images(32, batch=2)
    with torch.no_grad():
        expected = source(pixel_values=x).last_hidden_state
        torch.testing.assert_close(model.forward_features(x), expected, **TOL)

    # A save_pretrained folder: Hub file names, config.json found beside the weights.
    classifier = randomize(transformers.ViTForImageClassification(cfg))
    classifier.save_pretrained(tmp_path)
    model = vitkit.load_pretrained(tmp_path)
    assert model.config.num_heads == 2
    with torch.no_grad():
        torch.testing.assert_close(model(x), classifier(pixel_values=x).logits, **TOL)


@pytest.mark.parametrize("layout", ["legacy", "v5"])
def test_round_trip_vitkit_hf_vitkit(layout):
    model = randomize(
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5
        )
    )
    exported = convert.to_hf(model, layout=layout)
    hf = convert.to_hf_config(model.config)
    back, config = convert.from_hf(exported, config=hf)
    assert config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(back[key], value), key

    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    if layout == "v5" and int(transformers.__version__.split(".")[0]) >= 5:
        source = transformers.ViTForImageClassification(transformers.ViTConfig(**hf)).eval()
        source.load_state_dict(exported, strict=True)
        x = images(32, batch=2)
        with torch.no_grad():
            torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_to_hf_refuses_what_hf_cannot_express():
    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, global_pool="avg"
    )
    with pytest.raises(ValueError, match=r"needs a class token with global_pool='token'"):
        convert.to_hf(model)


def test_hf_other_activation_is_refused():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(hidden_act="gelu_new")
    source = transformers.ViTForImageClassification(cfg)
    with pytest.raises(CheckpointError, match=r"hidden_act='gelu_new'"):
        convert.from_hf(source.state_dict(), config=cfg)


# -- torchvision ---------------------------------------------------------------------------


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


# -- JAX npz -------------------------------------------------------------------------------


def write_jax_npz(model: VisionTransformer, path, prefix: str = "") -> None:
    """Write a model's weights in the layout of google-research/vision_transformer."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    dim, heads = model.embed_dim, model.config.num_heads
    hd = dim // heads
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (ph, pw, C, D)
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    if "cls_token" in sd:
        out["cls"] = sd["cls_token"]
    for i in range(model.config.depth):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = p + "MultiHeadDotProductAttention_1/"
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3)  # each (D_out, D_in)
        qb, kb, vb = np.split(sd[b + "attn.qkv.bias"], 3)
        for name, w, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            out[f"{mha}{name}/kernel"] = w.T.reshape(dim, heads, hd)
            out[f"{mha}{name}/bias"] = bias.reshape(heads, hd)
        out[mha + "out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(heads, hd, dim)
        out[mha + "out/bias"] = sd[b + "attn.proj.bias"]
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            out[f"{p}{theirs}/scale"] = sd[f"{b}{ours}.weight"]
            out[f"{p}{theirs}/bias"] = sd[f"{b}{ours}.bias"]
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{p}MlpBlock_3/{theirs}/kernel"] = sd[f"{b}mlp.{ours}.weight"].T
            out[f"{p}MlpBlock_3/{theirs}/bias"] = sd[f"{b}mlp.{ours}.bias"]
    np.savez(path, **{prefix + k: v for k, v in out.items()})


@pytest.mark.parametrize(
    "options, prefix",
    [
        pytest.param({}, "", id="token"),
        pytest.param({"class_token": False, "global_pool": "avg", "fc_norm": False}, "", id="gap"),
        pytest.param({}, "opt/target/", id="prefixed"),
    ],
)
def test_jax_npz(tmp_path, options, prefix):
    model = randomize(
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5, **options
        )
    )
    path = tmp_path / "vit.npz"
    write_jax_npz(model, path, prefix)
    sd, config = convert.from_jax(path)
    assert config == model.config  # heads are read from the kernels, not guessed
    for key, value in model.state_dict().items():
        torch.testing.assert_close(sd[key], value, atol=0, rtol=0, msg=key)
    loaded = vitkit.load_pretrained(path)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), **TOL)

    pytest.importorskip("timm", reason="timm not installed")
    if not prefix:  # timm's own npz loader is the independent reference
        reference = convert.source_model("jax", config, path)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), reference(x), **TOL)


def test_jax_pre_logits_drops_the_head(tmp_path, caplog):
    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, num_classes=5
    )
    path = tmp_path / "vit.npz"
    write_jax_npz(model, path)
    arrays = dict(np.load(path))
    arrays["pre_logits/kernel"], arrays["pre_logits/bias"] = np.eye(64), np.zeros(64)
    np.savez(path, **arrays)
    sd, config = convert.from_jax(path)
    assert config.num_classes == 0 and "head.weight" not in sd
    assert "pre_logits representation layer" in caplog.text


# -- format detection and the command line -------------------------------------------------


def test_detect_format():
    assert convert.detect_format({"conv_proj.weight": 0}) == "torchvision"
    assert convert.detect_format({"vit.embeddings.patch_embeddings.projection.weight": 0}) == "hf"
    assert convert.detect_format({"module.patch_embed.proj.weight": 0}) == "timm"
    assert convert.detect_format({"params/embedding/kernel": 0}) == "jax"
    with pytest.raises(CheckpointError, match=r"cannot tell the checkpoint format .*pass format="):
        convert.detect_format({"encoder.weight": 0})


def test_cli_convert_timm_with_parity(tmp_path, capsys):
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
    assert "parity vs timm: max |difference|" in text and "(ok, tolerance 1e-04)" in text
    loaded = vitkit.load(out)
    assert loaded.meta == {"converted_from": "timm"}
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), source(x), **TOL)


def test_cli_convert_jax_and_errors(tmp_path, capsys):
    model = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2)
    )
    write_jax_npz(model, tmp_path / "in.npz")
    out = tmp_path / "out.safetensors"
    assert (
        main(["convert", "--from", "jax", str(tmp_path / "in.npz"), str(out), "--no-parity"]) == 0
    )
    assert vitkit.load(out).config == model.config

    (tmp_path / "bad.pth").write_bytes(b"")
    code = main(["convert", "--from", "timm", str(tmp_path / "bad.pth"), str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and "is empty (0 bytes)" in err
