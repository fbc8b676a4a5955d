"""The BEiT family's weights (weights/beit/): vitkit's own checkpoints of a BEiT load and
inspect; timm's BEiT state dicts, files and Hub folders load without a name (the keys tell a
BEiT from a ViT, an EVA and a Swin, the tensors its sizes) and give timm's outputs within 1e-5;
the original layout (wrapped, with index buffers, a pre-training checkpoint's shared table) and
another size are fitted as timm's `checkpoint_filter_fn` fits them; a timm folder written by
vitkit is timm's same model; and a fine-tuning run from a timm BEiT folder, then eval, predict,
explain, ONNX export and the inference room."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from _helpers import image_folder, optional_import, randomize, requires_onnx, requires_timm
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.weights import inspect, load_any
from vitkit.weights.checkpoint import MissingOptionError
from vitkit.weights.families import reading_family

timm = optional_import("timm")
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=5)
# Every kind of key timm's Beit has.
KINDS = {
    "per-block tables": dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1),
    "shared table, class token": dict(use_shared_rel_pos_bias=True, global_pool="token"),
    "both tables, SwiGLU, no q/v bias": dict(use_rel_pos_bias=True, use_shared_rel_pos_bias=True,
                                             swiglu_mlp=True, scale_mlp=True, qkv_bias=False,
                                             init_values=1e-2, mlp_ratio=3.0),
}  # fmt: skip


def _timm_beit(**options) -> torch.nn.Module:
    from timm.models.beit import Beit as TimmBeit

    torch.manual_seed(0)
    return randomize(TimmBeit(**{**TINY, **options}))


def _timm(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomize(timm.create_model(name, pretrained=False, **options))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: int = 32) -> None:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def test_a_saved_beit_loads_as_saved_and_inspects_as_a_beit(tmp_path):
    model = vitkit.create_model("beit_base_patch16_224", **TINY).eval()
    vitkit.save(model, tmp_path / "b.safetensors")
    info = inspect(tmp_path / "b.safetensors")
    assert info.format == "vitkit" and info.config == model.config
    assert vitkit.model.architecture_of(info.config).name == "beit"
    loaded = vitkit.load(tmp_path / "b.safetensors")
    assert type(loaded) is type(model)
    _same(loaded, model)


@requires_timm
@pytest.mark.parametrize("kind", KINDS)
def test_a_timm_state_dict_loads_without_a_name_and_gives_timms_outputs(kind):
    source = _timm_beit(**KINDS[kind])
    assert reading_family("timm", list(source.state_dict())).architectures == ("beit",)
    model = load_pretrained(source.state_dict())
    assert type(model).__name__ == "Beit" and not model.training
    assert model.config.num_heads == 2 and model.config.img_size == 32
    _same(model, source)


@requires_timm
def test_a_registered_names_weights_load_with_and_without_it():
    name = "beitv2_base_patch16_224"
    source = _timm(name, depth=2, img_size=64)
    for arch in (None, name):
        model = load_pretrained(source.state_dict(), arch=arch)
        assert model.config.init_values == (1e-5 if arch else 0.1)  # the start only
        _same(model, source, 64)


@requires_timm
def test_the_keys_tell_a_beit_from_a_vit_an_eva_and_a_swin():
    def family(model: torch.nn.Module) -> tuple[str, ...]:
        return reading_family("timm", list(model.state_dict())).architectures

    assert family(timm.create_model("beit_base_patch16_224", depth=1)) == ("beit",)
    assert family(timm.create_model("eva02_tiny_patch14_224", depth=1)) == ("eva",)
    assert family(timm.create_model("vit_tiny_patch16_224", depth=1)) == ("vit",)
    swin = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=32, depths=(1, 1, 1, 1))
    assert family(swin) == ("swin", "swin_cr")


@requires_timm
def test_what_the_tensors_do_not_show_is_asked_for_in_one_line():
    absolute = _timm_beit(init_values=0.1)  # no tables: q_bias and gamma_1 read as an EVA's
    assert reading_family("timm", list(absolute.state_dict())).architectures == ("eva",)
    oblong = _timm_beit(img_size=(32, 48), use_rel_pos_bias=True)
    with pytest.raises(MissingOptionError, match="tables are not of a square grid; pass img_si"):
        load_pretrained(oblong.state_dict())
    model = vitkit.weights.families.reader("timm")(oblong.state_dict(), img_size=(32, 48))[1]
    assert model.grid_size == (4, 6)
    with pytest.raises(CheckpointError, match="it is a ViT name"):
        load_pretrained(_timm_beit(use_rel_pos_bias=True).state_dict(), arch="vit_base_patch16_224")


@requires_timm
def test_another_size_and_the_original_layout_fit_as_timms_checkpoint_filter_fn():
    """An original fine-tuned checkpoint ({'model': ...} with the index buffers) at 48 instead
    of 32: every table resized and the positions resampled as timm's; a pre-training
    checkpoint's shared table (with its mask token and MIM head) copied to each block."""
    from timm.models.beit import Beit as TimmBeit
    from timm.models.beit import checkpoint_filter_fn

    source = _timm_beit(use_rel_pos_bias=True, use_shared_rel_pos_bias=True, init_values=0.1)
    saved = {"model": dict(source.state_dict())}
    saved["model"]["blocks.0.attn.relative_position_index"] = torch.zeros(17, 17)
    model = load_pretrained(saved["model"], img_size=48, num_classes=3)
    theirs = TimmBeit(**{**TINY, "img_size": 48, "use_rel_pos_bias": True,
                         "use_shared_rel_pos_bias": True, "init_values": 0.1}).eval()  # fmt: skip
    theirs.load_state_dict(checkpoint_filter_fn(saved, theirs))
    assert model.head.out_features == 3 and model.patch_embed.grid_size == (6, 6)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), theirs.forward_features(x))
    pretraining = _timm_beit(use_shared_rel_pos_bias=True, use_abs_pos_emb=False, init_values=0.1)
    sd = {**pretraining.state_dict(), "mask_token": torch.zeros(1, 1, 64),
          "lm_head.weight": torch.zeros(8, 64), "lm_head.bias": torch.zeros(8)}  # fmt: skip
    tuned = vitkit.create_model("beit_base_patch16_224", **TINY)
    load_pretrained(sd, model=tuned)
    shared = pretraining.state_dict()["rel_pos_bias.relative_position_bias_table"]
    for block in tuned.blocks:
        assert torch.equal(block.attn.relative_position_bias_table.detach(), shared)


@requires_timm
def test_a_hub_folder_files_and_a_timm_folder_written_back(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    name = "beit_base_patch16_224"
    args = dict(depth=2, img_size=64, num_classes=4)
    source = _timm(name, **args)
    save_for_hf(source, str(tmp_path / "hub"), model_args=args, safe_serialization=True)
    info = inspect(tmp_path / "hub")
    assert info.format == "timm" and info.folder == "timm" and info.config.num_heads == 12
    assert info.data_config.mean == pytest.approx((0.5, 0.5, 0.5))
    _same(load_pretrained(tmp_path / "hub"), source, 64)
    _same(load_any(tmp_path / "hub"), source, 64)
    out = tmp_path / "converted.safetensors"
    assert cli.main(["convert", "--from", "timm", str(tmp_path / "hub"), str(out)]) == 0
    parity = capsys.readouterr().out.splitlines()[-1]
    assert parity.startswith(f"parity vs timm {name} (") and "(ok," in parity
    model = vitkit.load(out)
    _same(model, source, 64)
    torch.save({"module." + k: v for k, v in source.state_dict().items()}, tmp_path / "b.pth")
    _same(load_pretrained(tmp_path / "b.pth"), source, 64)
    assert cli.main(["export", "--checkpoint", str(out), "--format", "timm",
                     str(tmp_path / "timm")]) == 0  # fmt: skip
    again = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    _same(again, source, 64)


@requires_timm
@requires_onnx
def test_fine_tune_a_timm_beit_then_eval_predict_explain_export_and_infer(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    from vitkit.inference import load_for_inference

    args = dict(depth=2, embed_dim=64, num_heads=2, img_size=64)
    source = _timm("beitv2_base_patch16_224", **args)
    save_for_hf(source, str(tmp_path / "hub"), model_args=args, safe_serialization=True)
    image_folder(tmp_path / "data", ("cat", "dog"), per_class=12, size=40)
    run = tmp_path / "run"
    argv = ["train", "--pretrained", str(tmp_path / "hub"), "--data", str(tmp_path / "data"),
            "--img-size", "48", "--epochs", "1", "--batch-size", "8", "--out", str(run),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    checkpoint = run / "model.safetensors"
    model = vitkit.load(checkpoint)
    assert type(model).__name__ == "Beit" and model.config.num_classes == 2
    assert model.patch_embed.img_size == (48, 48)
    assert model.blocks[0].attn.relative_position_bias_table.shape == (5 * 5 + 3, 2)  # a 3 x 3 grid
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
    onnx_file = tmp_path / "beit.onnx"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "onnx",
                     str(onnx_file), "--verify"]) == 0  # fmt: skip
    assert onnx_file.is_file() and "image size 48x48" in capsys.readouterr().out
    argv = ["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--dynamic-img-size",
            str(tmp_path / "any.onnx")]  # fmt: skip
    assert cli.main(argv) == 2
    assert "relative position tables are made for one patch grid" in capsys.readouterr().err
    predictor = load_for_inference(checkpoint)
    x = torch.randn(2, 3, 48, 48)
    probs, _ = predictor.predict(x, topk=2)
    with torch.no_grad():
        expected = model(x).softmax(-1)
    torch.testing.assert_close(probs, expected.sort(-1, descending=True).values)
    assert list(predictor.class_names) == ["cat", "dog"]
