"""JAX npz converter (google-research/vision_transformer layout): exact weights, parity with
timm's own npz loader, the pre_logits layer, and `vitkit convert --from jax`."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from _helpers import write_jax_npz
from vitkit import VisionTransformer, convert
from vitkit.cli import main


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


# -- big_vision ---------------------------------------------------------------------------


def write_big_vision_npz(model, path, prefix: str = "params/img/", scan: bool = False) -> None:
    """Write a timm ViT's weights in big_vision's layout: the inverse of the `big_vision`
    branch of timm's `_load_weights` (blocks `MultiHeadDotProductAttention_0`, `LayerNorm_0/1`,
    `MlpBlock_0`; `pos_embedding` at the top; `MAPHead_0`), optionally scanned (one
    `Transformer/encoderblock/` with a leading depth axis)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    dim, heads = model.embed_dim, model.blocks[0].attn.num_heads
    hd = dim // heads

    def attention(out: dict, mha: str, q, k, v, biases, proj: str) -> None:
        for name, weight, bias in zip(("query", "key", "value"), (q, k, v), biases, strict=True):
            out[f"{mha}{name}/kernel"] = weight.T.reshape(dim, heads, hd)  # (D, H, hd)
            out[f"{mha}{name}/bias"] = bias.reshape(heads, hd)
        out[mha + "out/kernel"] = sd[proj + ".weight"].reshape(dim, heads, hd).transpose(1, 2, 0)
        out[mha + "out/bias"] = sd[proj + ".bias"]

    def dense(out: dict, theirs: str, ours: str) -> None:
        out[theirs + "/kernel"], out[theirs + "/bias"] = sd[ours + ".weight"].T, sd[ours + ".bias"]

    def norm(out: dict, theirs: str, ours: str) -> None:
        out[theirs + "/scale"], out[theirs + "/bias"] = sd[ours + ".weight"], sd[ours + ".bias"]

    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (ph, pw, C, D)
        "embedding/bias": sd["patch_embed.proj.bias"],
    }
    if "pos_embed" in sd:  # big_vision's posemb='sincos2d' has no array
        out["pos_embedding"] = sd["pos_embed"]
    norm(out, "Transformer/encoder_norm", "norm")
    if "cls_token" in sd:
        out["cls"] = sd["cls_token"]
    if "head.weight" in sd:
        dense(out, "head", "head")
    if "attn_pool.latent" in sd:
        out["MAPHead_0/probe"] = sd["attn_pool.latent"]
        k, v = np.split(sd["attn_pool.kv.weight"], 2)
        biases = (sd["attn_pool.q.bias"], *np.split(sd["attn_pool.kv.bias"], 2))
        mha = "MAPHead_0/MultiHeadDotProductAttention_0/"
        attention(out, mha, sd["attn_pool.q.weight"], k, v, biases, "attn_pool.proj")
        norm(out, "MAPHead_0/LayerNorm_0", "attn_pool.norm")
        for r in range(2):
            dense(out, f"MAPHead_0/MlpBlock_0/Dense_{r}", f"attn_pool.mlp.fc{r + 1}")
    blocks = []
    for i in range(len(model.blocks)):
        b, block = f"blocks.{i}.", {}
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3)  # each (D_out, D_in)
        biases = np.split(sd[b + "attn.qkv.bias"], 3)
        attention(block, "MultiHeadDotProductAttention_0/", q, k, v, biases, b + "attn.proj")
        norm(block, "LayerNorm_0", b + "norm1")
        norm(block, "LayerNorm_1", b + "norm2")
        for r in range(2):
            dense(block, f"MlpBlock_0/Dense_{r}", f"{b}mlp.fc{r + 1}")
        blocks.append(block)
    if scan:  # (depth, ...) per array
        out.update(
            {f"Transformer/encoderblock/{k}": np.stack([b[k] for b in blocks]) for k in blocks[0]}
        )
    else:
        for i, block in enumerate(blocks):
            out.update({f"Transformer/encoderblock_{i}/{k}": a for k, a in block.items()})
    two_tower = prefix == "params/img/"  # a text tower and temperature beside the image model
    extra = {"params/txt/Embed_0/embedding": np.zeros((3, 4)), "params/t": np.ones(1)}
    np.savez(path, **{prefix + k: a for k, a in out.items()}, **(extra if two_tower else {}))


BIG_VISION = [  # timm name, options, npz prefix, scanned, vitkit arch=
    pytest.param("vit_base_patch16_siglip_224", {}, "params/img/", False, None, id="siglip-map"),
    pytest.param(
        "vit_base_patch32_siglip_256",
        {},
        "params/img/",
        True,
        "vit_base_patch32_siglip_256",
        id="siglip2-map-tanh-scanned",
    ),
    pytest.param("vit_base_patch16_siglip_gap_224", {}, "", False, None, id="siglip-gap"),
    pytest.param("flexivit_small", {"num_classes": 5}, "params/", False, None, id="tok"),
    pytest.param(  # pre-2022 big_vision: the class token's position in the table
        "vit_small_patch16_224", {"num_classes": 5}, "params/", True, None, id="tok-old-posemb"
    ),
    pytest.param("vit_base_patch16_siglip_224", {"num_classes": 5}, "", False, None, id="map-head"),
]


@pytest.mark.parametrize("name, options, prefix, scan, arch", BIG_VISION)
def test_big_vision_npz_matches_timm(tmp_path, name, options, prefix, scan, arch):
    """A big_vision file loads into vitkit with timm's outputs (1e-5): timm's own
    `_load_weights` reads the same file into a fresh timm model of the family."""
    timm = pytest.importorskip("timm")
    from timm.models.vision_transformer import _load_weights

    small = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8, **options)
    source = randomize(timm.create_model(name, pretrained=False, **small))
    path = tmp_path / "bv.npz"
    write_big_vision_npz(source, path, prefix, scan)
    reference = timm.create_model(name, pretrained=False, **small).eval()
    _load_weights(reference, str(path))
    loaded = vitkit.load_pretrained(path, arch=arch) if arch else vitkit.load_pretrained(path)
    assert loaded.config.num_heads == 4  # from the kernels, not the name's 12
    assert loaded.config.act_layer == ("gelu_tanh" if arch else "gelu")
    pool = {"map": "map", "avg": "avg", "token": "token"}[source.global_pool]
    assert (loaded.config.global_pool, loaded.config.class_token) == (pool, source.has_class_token)
    assert loaded.config.no_embed_class == source.no_embed_class  # read from the table's length
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), source(x), atol=0, rtol=0)  # writer = inverse
        torch.testing.assert_close(loaded(x), reference(x), **TOL)
        torch.testing.assert_close(loaded.forward_features(x), reference.forward_features(x), **TOL)


def test_big_vision_without_a_position_table_is_sincos2d(tmp_path):
    """big_vision's posemb='sincos2d' stores no table: vitkit's sincos2d is big_vision's."""
    model = randomize(
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5,
            class_token=False, global_pool="avg", fc_norm=False, pos_embed="sincos2d",
        )
    )  # fmt: skip
    write_big_vision_npz(model, tmp_path / "bv.npz", prefix="params/")
    assert convert.from_jax(tmp_path / "bv.npz")[1].img_size == 224  # not recorded: assumed
    loaded = vitkit.load_pretrained(tmp_path / "bv.npz", img_size=32)
    assert loaded.config == model.config
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), **TOL)


def _siglip(tmp_path, **options):
    timm = pytest.importorskip("timm")
    small = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8, **options)
    model = randomize(timm.create_model("vit_base_patch16_siglip_224", **small))
    write_big_vision_npz(model, tmp_path / "siglip.npz")
    return tmp_path / "siglip.npz"


@pytest.mark.parametrize("scan", [False, True])
def test_cli_convert_big_vision_parity_line(tmp_path, capsys, scan):
    """A SigLIP 2 file (tanh GELU, which the arrays do not record): without a name the line
    checks timm's npz reading only and names the activation; with the name, timm's model of it
    reads the file with its own loader and computes what the converted model does."""
    timm = pytest.importorskip("timm")
    small = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, patch_size=8)
    torch.manual_seed(0)
    source = randomize(timm.create_model("vit_base_patch32_siglip_256", **small))
    write_big_vision_npz(source, tmp_path / "siglip2.npz", scan=scan)
    argv = ["convert", "--from", "jax", str(tmp_path / "siglip2.npz"), str(tmp_path / "v.st")]
    assert main(argv) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(
        "parity: checked the key mapping only, against timm's npz loader and VisionTransformer "
        "built from vitkit's inferred config: max |difference| "
    )
    assert "(ok" not in line
    assert main([*argv, "--arch", "vit_base_patch32_siglip_256"]) == 0
    match = re.fullmatch(
        r"parity vs timm vit_base_patch32_siglip_256 \(depth=2, img_size=32, embed_dim=64, "
        r"num_heads=4, patch_size=8\), the file read by timm's npz loader: max \|difference\| "
        r"(\S+) over the pooled features and tokens of a random batch of 2 \(ok, tolerance "
        r"1e-04\)",
        capsys.readouterr().out.splitlines()[-1],
    )
    assert match and float(match[1]) <= 1e-5
    converted, x = vitkit.load(tmp_path / "v.st"), images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(converted.forward_features(x), source.forward_features(x), **TOL)


def test_big_vision_unknown_array_is_named(tmp_path):
    path = _siglip(tmp_path)
    arrays = dict(np.load(path))
    arrays["params/img/Transformer/encoderblock_1/LayerScale_0/scale"] = np.ones(64)
    np.savez(path, **arrays)
    with pytest.raises(vitkit.CheckpointError) as err:
        vitkit.load_pretrained(path)
    message = str(err.value)
    key = "params/img/Transformer/encoderblock_1/LayerScale_0/scale"
    assert message.startswith(f"big_vision arrays not understood: {key};")
    assert "\n" not in message


def test_cli_convert_and_train_big_vision(tmp_path, capsys):
    from PIL import Image

    path = _siglip(tmp_path, num_classes=5)  # the CLI's parity check compares logits
    out = tmp_path / "siglip.safetensors"
    assert main(["convert", "--from", "jax", str(path), str(out)]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .endswith(
            "; the weights do not record the activation (exact GELU assumed): pass --arch NAME to "
            "check against timm"
        )
    )
    assert (vitkit.load(out).config.global_pool, vitkit.load(out).config.num_classes) == ("map", 5)

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (data / name).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(
                data / name / f"{i}.png"
            )
    argv = ["train", "--pretrained", str(path), "--data", str(data), "--img-size", "48"]
    argv += ["--model-opt", "act_layer=gelu_tanh", "--epochs", "1", "--batch-size", "4"]
    run = tmp_path / "run"
    assert main([*argv, "--out", str(run), "--no-progress"]) == 0, capsys.readouterr().err
    model = vitkit.load(run / "model.safetensors")
    assert (model.config.num_classes, model.config.act_layer) == (2, "gelu_tanh")
    assert model.pos_embed.shape == (1, 6 * 6, 64)  # no class token; 4x4 grid resampled
