"""The EVA family's weights (weights/eva/): vitkit's own checkpoints of an EVA load and inspect;
timm's EVA state dicts, files and Hub folders load with their name (the keys tell an EVA from a
ViT, a Swin and a BEiT; a name reads keys that look like a ViT's) and give timm's outputs within
1e-5 relative, also fitted to another size as timm's `checkpoint_filter_fn` fits them; and a
fine-tuning run from a timm EVA-02 folder, then eval, predict, explain, ONNX export and the
inference room, end to end."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from _helpers import (
    image_folder,
    optional_import,
    randomize,
    relative_error,
    requires_onnx,
    requires_timm,
)
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.weights import inspect, load_any
from vitkit.weights.checkpoint import ArchMismatchError, MissingOptionError
from vitkit.weights.families import reading_family

timm = optional_import("timm")
RTOL = 1e-5
TINY = dict(depth=2, embed_dim=64, num_heads=2)  # an EVA-02 of 2 blocks, 64 wide


def _timm(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomize(timm.create_model(name, pretrained=False, **options))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: int) -> None:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) < RTOL


def test_a_saved_eva_loads_as_saved_and_inspects_as_an_eva(tmp_path):
    model = vitkit.create_model("eva02_tiny_patch14_224", **TINY, num_classes=3).eval()
    vitkit.save(model, tmp_path / "eva.safetensors", meta={"class_names": ["a", "b", "c"]})
    info = inspect(tmp_path / "eva.safetensors")
    assert info.format == "vitkit" and info.config == model.config
    assert type(info.config).__name__ == "EvaConfig"
    assert vitkit.model.architecture_of(info.config).name == "eva"
    loaded = vitkit.load(tmp_path / "eva.safetensors")
    assert type(loaded) is type(model) and loaded.meta["class_names"] == ["a", "b", "c"]
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


# One per kind of key: EVA-02 T (q_bias, packed SwiGLU), EVA-02 B (q_proj, fc1_g, mlp.norm),
# EVA-02 CLIP (attn.norm), EVA (GELU), PE core (attention pool after norm_pre), RoPE-Mixed
# (rope.freqs), DINOv3 (gamma_1, registers), Sapiens2 (grouped key / value heads, q_norm).
# name -> (timm's options, the input side: DINOv3 and Sapiens2 take any size)
KINDS = {
    "eva02_tiny_patch14_224": (dict(depth=2), 224),
    "eva02_base_patch14_224": (dict(depth=2, img_size=112), 112),
    "eva02_base_patch16_clip_224": (dict(depth=2, img_size=112), 112),
    "eva_giant_patch14_224": (dict(depth=2, embed_dim=128, num_heads=16, img_size=112), 112),
    "vit_pe_core_tiny_patch16_384": (dict(depth=2), 384),
    "vit_small_patch16_rope_mixed_224": (dict(depth=2), 224),
    "vit_small_patch16_dinov3": (dict(depth=2), 128),
    "vit_base_patch16_sapiens2": (dict(depth=2, num_kv_heads=(12, 6)), 128),
}


@requires_timm
@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_timm_state_dict_loads_with_its_name_and_timms_outputs(name):
    options, side = KINDS[name]
    source = _timm(name, **options)
    keys = list(source.state_dict())
    assert reading_family("timm", keys).architectures == ("eva",)
    model = load_pretrained(source.state_dict(), arch=name)
    assert type(model).__name__ == "Eva" and not model.training
    assert model.config.depth == 2 and model.config.num_kv_heads == options.get("num_kv_heads", ())
    _same(model, source, side)


@requires_timm
def test_what_the_keys_cannot_tell_needs_the_name_in_one_line():
    source = _timm("eva02_small_patch14_224", depth=2)
    with pytest.raises(
        MissingOptionError,
        match=r"^timm EVA weights do not record their rotary embedding, head count nor norm "
        r"epsilon; pass arch='<timm model name>'$",
    ):
        load_pretrained(source.state_dict())
    with pytest.raises(
        ArchMismatchError,
        match=r"^the weights are not 'vit_small_patch16_224': they have the keys of timm's "
        r"eva.py, and it is a ViT name; ",
    ):
        load_pretrained(source.state_dict(), arch="vit_small_patch16_224")
    with pytest.raises(CheckpointError, match=r"^timm EVA weights do not match "
                       r"eva02_base_patch14_224 at their sizes \(missing: "):  # fmt: skip
        load_pretrained(source.state_dict(), arch="eva02_base_patch14_224")
    # heads the weights do not show come from the name, or num_heads=
    narrow = _timm("eva02_small_patch14_224", depth=2, embed_dim=96, num_heads=2)
    model = load_pretrained(narrow.state_dict(), arch="eva02_small_patch14_224", num_heads=2)
    _same(model, narrow, 224)


@requires_timm
def test_the_keys_tell_an_eva_from_a_vit_a_swin_and_a_beit():
    def family(model: torch.nn.Module) -> tuple[str, ...]:
        return reading_family("timm", list(model.state_dict())).architectures

    plain = timm.create_model("vit_tiny_patch16_224", depth=1)
    # timm's ViT has attn.norm / mlp.norm (scale norms) and fc1_g (AIMv2's SwiGLU) too
    scaled = timm.create_model("vit_tiny_patch16_224", depth=1, scale_attn_norm=True,
                               scale_mlp_norm=True)  # fmt: skip
    aimv2 = timm.create_model("aimv2_large_patch14_224", depth=1, embed_dim=64, num_heads=2)
    layerscale = timm.create_model("vit_tiny_patch16_224", depth=1, init_values=1e-5)
    for vit in (plain, scaled, aimv2, layerscale):
        assert family(vit) == ("vit",)
    swin = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=32, depths=(1, 1, 1, 1))
    assert family(swin) == ("swin", "swin_cr")
    # BEiT has EVA's q_bias and gamma_1 beside relative position tables: a BEiT's
    beit = timm.create_model("beit_base_patch16_224", depth=1)
    assert {"blocks.0.attn.q_bias", "blocks.0.gamma_1"} <= set(beit.state_dict())
    assert family(beit) == ("beit",)


@requires_timm
def test_keys_like_a_vits_read_as_an_eva_by_its_name():
    """A PE spatial model has no LayerScale, no EVA biases and no attention pool: its keys
    are a pre-norm ViT's, and its name makes them an EVA's (with rotary positions)."""
    name = "vit_pe_spatial_tiny_patch16_512"
    source = _timm(name, depth=2, img_size=128)
    assert reading_family("timm", list(source.state_dict())).architectures == ("vit",)
    model = load_pretrained(source.state_dict(), arch=name)
    assert type(model).__name__ == "Eva" and model.config.use_rot_pos_emb
    assert model.config.img_size == 128  # from the position table
    _same(model, source, 128)


@requires_timm
def test_a_hub_folder_and_files(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    name = "eva02_tiny_patch14_224"
    source = _timm(name, **TINY, num_classes=5)
    save_for_hf(source, str(tmp_path / "hub"), model_args={**TINY, "num_classes": 5},
                safe_serialization=True)  # fmt: skip
    info = inspect(tmp_path / "hub")
    assert info.format == "timm" and info.folder == "timm"
    assert info.config.embed_dim == 64 and info.config.num_heads == 2
    assert info.data_config.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    _same(load_pretrained(tmp_path / "hub"), source, 224)
    _same(load_any(tmp_path / "hub"), source, 224)
    out = tmp_path / "converted.safetensors"
    assert cli.main(["convert", "--from", "timm", str(tmp_path / "hub"), str(out)]) == 0
    parity = capsys.readouterr().out.splitlines()[-1]
    assert parity.startswith("parity vs timm eva02_tiny_patch14_224 (") and "(ok," in parity
    _same(vitkit.load(out), source, 224)
    torch.save({"module." + k: v for k, v in source.state_dict().items()}, tmp_path / "e.pth")
    with pytest.raises(MissingOptionError, match="pass arch='<timm model name>'$"):
        load_pretrained(tmp_path / "e.pth")
    model = load_pretrained(tmp_path / "e.pth", arch=name, num_heads=2)
    assert model.data_config.crop_pct == 0.9  # timm's EVA default, stated in a log line
    _same(model, source, 224)


@requires_timm
def test_fine_tuning_at_another_size_fits_the_weights_as_timm():
    """EVA-02 at 112: the position table resampled as timm's `checkpoint_filter_fn` does, the
    rotary embedding on the 8 x 8 grid scaled to the 16 x 16 reference; a new head."""
    from timm.models.eva import checkpoint_filter_fn

    name = "eva02_small_patch14_224"
    source = _timm(name, depth=2)
    model = load_pretrained(source.state_dict(), arch=name, img_size=112)
    theirs = timm.create_model(name, pretrained=False, depth=2, img_size=112).eval()
    theirs.load_state_dict(checkpoint_filter_fn(source.state_dict(), theirs))
    assert model.pos_embed.shape == theirs.pos_embed.shape == (1, 65, 384)
    _same(model, theirs, 112)
    headed = load_pretrained(source.state_dict(), arch=name, img_size=112, num_classes=3)
    assert headed.head.out_features == 3
    x = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        torch.testing.assert_close(headed.forward_features(x), theirs.forward_features(x))


@requires_timm
@requires_onnx
def test_fine_tune_a_timm_eva02_then_eval_predict_explain_export_and_infer(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    from vitkit.inference import load_for_inference

    source = _timm("eva02_tiny_patch14_224", **TINY)
    save_for_hf(source, str(tmp_path / "hub"), model_args=TINY, safe_serialization=True)
    image_folder(tmp_path / "data", ("cat", "dog"), per_class=12, size=40)
    run = tmp_path / "run"
    argv = ["train", "--pretrained", str(tmp_path / "hub"), "--data", str(tmp_path / "data"),
            "--img-size", "112", "--epochs", "1", "--batch-size", "8", "--out", str(run),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    checkpoint = run / "model.safetensors"
    # a file of the folder needs the name, and a name of other heads than the width allows is
    # refused with the reason, before any model is built
    weights = str(tmp_path / "hub" / "model.safetensors")
    for extra, message in (([], "pass --model NAME"),
                           (["--model", "eva02_tiny_patch14_224"], "embed_dim 64 is not divisible "
                            "by num_heads 3")):  # fmt: skip
        argv = ["train", "--pretrained", weights, "--data", str(tmp_path / "data"), *extra,
                "--out", str(tmp_path / "refused")]  # fmt: skip
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    model = vitkit.load(checkpoint)
    assert type(model).__name__ == "Eva" and model.config.num_classes == 2
    assert model.patch_embed.img_size == (112, 112) and model.pos_embed.shape == (1, 65, 64)
    assert model.config.ref_feat_shape == (16, 16)  # the rotary grid scales to pre-training's
    assert model.data_config.input_size == (3, 112, 112)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(checkpoint), "--data", str(tmp_path / "data"),
                     "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 4 and 0.0 <= result["acc1"] <= 1.0
    image = tmp_path / "data" / "cat" / "0.png"
    assert cli.main(["predict", "--checkpoint", str(run), "--topk", "2", str(image)]) == 0
    assert capsys.readouterr().out.startswith(f"{image}: ")
    explained = tmp_path / "e.png"
    assert cli.main(["explain", "--checkpoint", str(run), str(image), "--output",
                     str(explained)]) == 0  # fmt: skip
    assert capsys.readouterr().out.endswith(f"attention maps in {explained}\n")
    assert explained.is_file()
    onnx_file = tmp_path / "eva.onnx"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "onnx",
                     str(onnx_file), "--verify"]) == 0  # fmt: skip
    assert onnx_file.is_file() and "image size 112x112" in capsys.readouterr().out
    predictor = load_for_inference(checkpoint)
    x = torch.randn(2, 3, 112, 112)
    probs, classes = predictor.predict(x, topk=2)
    with torch.no_grad():
        expected = model(x).softmax(-1)
    torch.testing.assert_close(probs, expected.sort(-1, descending=True).values)
    assert list(predictor.class_names) == ["cat", "dog"]
    refusals = {
        "hf": "transformers has no DINOv3 classifier (DINOv3ViTModel is the backbone), this "
        "model has a 2-class head; drop it first (model.reset_classifier(0, global_pool='token'))"
        "; export --format onnx",
        "timm": "a timm folder's config.json cannot carry an EVA's norm epsilon",
    }
    for format, message in refusals.items():
        argv = ["export", "--checkpoint", str(checkpoint), "--format", format,
                str(tmp_path / format)]  # fmt: skip
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / format).exists()


# -- original layouts, moved as timm's `checkpoint_filter_fn` moves them ---------------------


def _renamed(state_dict: dict, swaps: tuple[tuple[str, str], ...]) -> dict:
    out = {}
    for key, value in state_dict.items():
        for old, new in swaps:
            key = key.replace(old, new)
        out[key] = value
    return out


def _dinov3_original(model: torch.nn.Module) -> dict:
    """timm's DINOv3 back in Meta's layout: storage tokens, `ls1.gamma`, one qkv bias (keys
    zero), the rope periods buffer and the mask token."""
    sd = model.state_dict()
    out = _renamed({k: v for k, v in sd.items() if not k.endswith(("q_bias", "v_bias"))},
                   (("reg_token", "storage_tokens"), ("gamma_1", "ls1.gamma"),
                    ("gamma_2", "ls2.gamma")))  # fmt: skip
    for i in range(len(model.blocks)):
        q = sd.get(f"blocks.{i}.attn.q_bias", torch.zeros(model.embed_dim))
        v = sd.get(f"blocks.{i}.attn.v_bias", torch.zeros(model.embed_dim))
        out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])
    return {
        **out,
        "mask_token": torch.zeros(1, model.embed_dim),
        "rope_embed.periods": torch.ones(8),
    }


def _pe_original(model: torch.nn.Module) -> dict:
    """timm's PE core back in Meta's layout (`visual.` prefix, `conv1`, `resblocks`, the pool's
    `probe` and packed projection, the head as `proj`)."""
    sd = dict(model.state_dict())
    out = {
        "class_embedding": sd.pop("cls_token")[0, 0],
        "positional_embedding": sd.pop("pos_embed")[0],
        "proj": sd.pop("head.weight").t(),
        "attn_pool.probe": sd.pop("attn_pool.latent"),
        "attn_pool.attn.in_proj_weight": torch.cat([sd.pop("attn_pool.q.weight"),
                                                    sd.pop("attn_pool.kv.weight")]),
        "attn_pool.attn.in_proj_bias": torch.cat([sd.pop("attn_pool.q.bias"),
                                                  sd.pop("attn_pool.kv.bias")]),
    }  # fmt: skip
    del sd["head.bias"]  # PE's projection has none (timm's starts at zero)
    swaps = (
        ("patch_embed.proj", "conv1"), ("blocks.", "transformer.resblocks."),
        ("norm_pre", "ln_pre"), ("norm1", "ln_1"), ("norm2", "ln_2"),
        ("attn.qkv.", "attn.in_proj_"), ("attn.proj", "attn.out_proj"),
        ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj"),
        ("attn_pool.proj", "attn_pool.attn.out_proj"), ("attn_pool.norm", "attn_pool.layernorm"),
    )  # fmt: skip
    out.update(_renamed(sd, swaps))
    out = {("ln_post" + k[4:] if k.startswith("norm.") else k): v for k, v in out.items()}
    return {"visual." + k: v for k, v in out.items()}


def _eva02_original(model: torch.nn.Module, prefix: str, mim: bool) -> dict:
    """timm's EVA-02 B back in BAAI's layout (`ffn_ln`, `inner_attn_ln`, `w1` / `w2` / `w3`,
    `q_bias`), under OpenCLIP's prefix with a text tower, or as MIM pre-training weights."""
    swaps = (("mlp.norm", "mlp.ffn_ln"), ("attn.norm", "attn.inner_attn_ln"),
             ("mlp.fc1_g", "mlp.w1"), ("mlp.fc1_x", "mlp.w2"), ("mlp.fc2", "mlp.w3"),
             ("q_proj.bias", "q_bias"), ("v_proj.bias", "v_bias"))  # fmt: skip
    out = _renamed(dict(model.state_dict()), swaps)
    if mim:
        out = {("norm." + k[8:] if k.startswith("fc_norm.") else k): v for k, v in out.items()}
        out["mask_token"] = torch.zeros(1, 1, model.embed_dim)
        out["lm_head.weight"], out["lm_head.bias"] = torch.zeros(8, model.embed_dim), torch.zeros(8)
    out = {prefix + k: v for k, v in out.items()}
    return {**out, "text.token_embedding.weight": torch.ones(2)} if prefix else out


def _sapiens2_original(model: torch.nn.Module) -> dict:
    """timm's Sapiens2 back in Meta's layout (`wq` / `wk` / `wv`, `ffn.w12` / `w3`, `ln1` /
    `ln2`, the attention's own LayerScale, storage tokens, a mask token)."""
    swaps = (
        ("reg_token", "storage_tokens"), ("patch_embed.proj.", "patch_embed.projection."),
        ("attn.q_proj.", "attn.wq."), ("attn.k_proj.", "attn.wk."), ("attn.v_proj.", "attn.wv."),
        ("gamma_1", "attn.gamma.weight"), (".mlp.fc1.", ".ffn.w12."), (".mlp.fc2.", ".ffn.w3."),
        (".norm1.", ".ln1."), (".norm2.", ".ln2."),
    )  # fmt: skip
    out = _renamed(dict(model.state_dict()), swaps)
    out = {("ln1." + k[5:] if k.startswith("norm.") else k): v for k, v in out.items()}
    return {**out, "mask_token": torch.zeros(1, model.embed_dim)}


ORIGINALS = {
    "sapiens2": ("vit_base_patch16_sapiens2", _sapiens2_original),
    "dinov3 with biases": ("vit_small_patch16_dinov3_qkvb", _dinov3_original),
    "dinov3 without": ("vit_small_patch16_dinov3", _dinov3_original),
    "pe core": ("vit_pe_core_tiny_patch16_384", _pe_original),
    "eva02 mim": ("eva02_base_patch14_224", lambda m: _eva02_original(m, "", mim=True)),
    "eva02 openclip": (
        "eva02_base_patch16_clip_224",
        lambda m: _eva02_original(m, "visual.", mim=False),
    ),
}


@requires_timm
@pytest.mark.parametrize("kind", sorted(ORIGINALS))
def test_original_layouts_move_as_timms_checkpoint_filter_fn(kind):
    from timm.models.eva import checkpoint_filter_fn

    from vitkit.weights.eva.original import timm_eva_layout

    name, original = ORIGINALS[kind]
    source = _timm(name, depth=2, **({"num_kv_heads": (12, 6)} if "sapiens2" in name else {}))
    weights = original(source)
    assert reading_family("timm", list(weights)).architectures == ("eva",)
    theirs = checkpoint_filter_fn(dict(weights), source)
    ours = timm_eva_layout(
        weights, qkv_bias=getattr(source.blocks[0].attn, "q_bias", 0) is not None
    )
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # the moved weights load by name and give the outputs of timm's model holding them
    source.load_state_dict(theirs)
    side = 128 if "dinov3" in name or "sapiens2" in name else vitkit.model.get_config(name).img_size
    _same(load_pretrained(weights, arch=name), source, side)
