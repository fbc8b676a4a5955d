"""JAX npz converter (google-research/vision_transformer layout): exact weights, parity with
timm's own npz loader, the pre_logits layer, and `vitkit convert --from jax`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import VisionTransformer, convert
from vitkit.cli import main


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
