"""The SAM ViT's weights (weights/sam/): timm's state dicts load without a name where the tensors
show every size (the keys tell a SAM ViT from a ViT, an EVA and a Swin), Meta's original Segment
Anything checkpoints load as timm's `checkpoint_filter_fn` moves them, both giving timm's outputs
within 1e-5; fitted to another size they give timm's model reading the same weights there;
vitkit's own checkpoints load; and the command line trains, evaluates and predicts with the
224 classifier's kind on the digits, and refuses a neck-only model where it needs a head."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_onnx, requires_timm
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.weights import inspect
from vitkit.weights.families import reading_family

timm = optional_import("timm")
TINY = dict(img_size=64, patch_size=8, embed_dim=64, depth=3, num_heads=2, window_size=4,
            global_attn_indexes=(1,), neck_chans=32, use_rel_pos=True)  # fmt: skip


def _timm_sam(**options) -> torch.nn.Module:
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    torch.manual_seed(0)
    return randomize(VisionTransformerSAM(**{**TINY, "num_classes": 0, **options}))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: int) -> None:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


@requires_timm
@pytest.mark.parametrize(
    "options",
    [{}, dict(num_classes=5, qk_norm=True, init_values=0.1, pre_norm=True),
     dict(neck_chans=None, use_abs_pos=False, num_classes=7)],
    ids=["encoder", "layerscale", "224 classifier"],
)  # fmt: skip
def test_a_timm_state_dict_loads_without_a_name_and_gives_timms_outputs(options):
    source = _timm_sam(**options)
    assert reading_family("timm", list(source.state_dict())).architectures == ("sam",)
    model = load_pretrained(source.state_dict())
    assert type(model).__name__ == "SamViT" and not model.training
    config = model.config
    assert (config.window_size, config.global_attn_indexes, config.num_heads) == (4, (1,), 2)
    assert config.img_size == 64 and config.neck_chans == (options.get("neck_chans", 32) or 0)
    _same(model, source, 64)


@requires_timm
def test_the_keys_tell_a_sam_vit_from_a_vit_an_eva_and_a_swin():
    def family(model: torch.nn.Module) -> tuple[str, ...]:
        return reading_family("timm", list(model.state_dict())).architectures

    assert family(timm.create_model("vit_tiny_patch16_224", depth=1)) == ("vit",)
    assert family(timm.create_model("eva02_tiny_patch14_224", depth=1)) == ("eva",)
    swin = timm.create_model("swin_tiny_patch4_window7_224", embed_dim=32, depths=(1, 1, 1, 1))
    assert family(swin) == ("swin", "swin_cr")


@requires_timm
def test_the_original_segment_anything_layout_moves_as_timms_filter():
    from timm.models.vision_transformer_sam import checkpoint_filter_fn

    source = _timm_sam()
    original = {
        f"image_encoder.{k}".replace("mlp.fc", "mlp.lin"): v for k, v in source.state_dict().items()
    }
    original["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] = torch.ones(2, 128)
    original["mask_decoder.iou_token.weight"] = torch.ones(1, 256)
    assert reading_family("timm", list(original)).architectures == ("sam",)
    model = load_pretrained(original, arch="samvit_base_patch16")
    assert set(model.state_dict()) == set(checkpoint_filter_fn(original, source))
    _same(model, source, 64)


@requires_timm
def test_fitting_to_another_size_gives_timms_model_at_that_size():
    """At 96 x 96 timm reads the 64 x 64 weights by resampling the position map and
    interpolating the global tables at each pass; the fitted weights hold the same, so the
    model built at 96 computes what timm's does."""
    source = _timm_sam()
    model = load_pretrained(source.state_dict(), img_size=96)
    assert model.pos_embed.shape == (1, 12, 12, 64)
    assert model.blocks[1].attn.rel_pos_h.shape == (23, 32)  # global: 2 * 12 - 1
    assert model.blocks[0].attn.rel_pos_h.shape == (7, 32)  # window: 2 * 4 - 1, unchanged
    _same(model, source, 96)
    headed = load_pretrained(source.state_dict(), num_classes=3)
    assert headed.get_classifier().out_features == 3


@requires_timm
def test_what_the_keys_cannot_tell_comes_from_the_name_or_is_refused_in_one_line():
    source = _timm_sam(use_rel_pos=False, num_heads=4)
    with pytest.raises(
        CheckpointError,
        match=r"^timm SAM ViT weights read as samvit_base_patch16: embed_dim 64 is not divisible "
        r"by num_heads 12",
    ):
        load_pretrained(source.state_dict())
    # without tables the window and the global blocks are the name's, else given
    model = load_pretrained(source.state_dict(), num_heads=4, window_size=4)
    assert model.config.global_attn_indexes == (2,)  # SAM ViT-B's within three blocks
    model = load_pretrained(
        source.state_dict(), num_heads=4, window_size=4, global_attn_indexes=(1,)
    )
    _same(model, source, 64)
    with pytest.raises(CheckpointError, match=r"^the weights are not 'vit_tiny_patch16_224'"):
        load_pretrained(source.state_dict(), arch="vit_tiny_patch16_224")


def test_a_saved_sam_vit_loads_as_saved_and_inspects_as_one(tmp_path):
    model = vitkit.create_model("samvit_base_patch16_224", **{**TINY, "neck_chans": 0}).eval()
    vitkit.save(model, tmp_path / "sam.safetensors")
    info = inspect(tmp_path / "sam.safetensors")
    assert info.format == "vitkit" and info.config == model.config
    loaded = vitkit.load(tmp_path / "sam.safetensors")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_train_eval_predict_on_the_digits_and_a_neck_only_model_refused(tmp_path, capsys):
    from PIL import Image

    small = ["--img-size", "32", "--model-opt", "patch_size=4", "--model-opt", "embed_dim=16",
             "--model-opt", "depth=2", "--model-opt", "num_heads=2", "--model-opt",
             "window_size=4", "--model-opt", "global_attn_indexes=[1]"]  # fmt: skip
    run = tmp_path / "run"
    argv = ["train", "--data", "digits", "--model", "samvit_base_patch16_224", *small,
            "--epochs", "1", "--batch-size", "128", "--out", str(run), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(run / "model.safetensors")
    assert type(model).__name__ == "SamViT" and model.config.num_classes == 10
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(run), "--data", "digits", "--json"]) == 0
    assert '"count": 359' in capsys.readouterr().out
    image = tmp_path / "x.png"
    Image.new("RGB", (32, 32)).save(image)
    assert cli.main(["predict", "--checkpoint", str(run), "--topk", "2", str(image)]) == 0
    assert capsys.readouterr().out.startswith(f"{image}: ")
    neck_only = tmp_path / "neck.safetensors"
    vitkit.save(vitkit.create_model("samvit_base_patch16", **TINY), neck_only)
    for command in (["predict", str(image)], ["eval", "--data", "digits"]):
        assert cli.main([command[0], "--checkpoint", str(neck_only), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert "without a classifier head" in err and err.count("\n") == 1, err
    assert cli.main(["summary", "samvit_base_patch16", "--flow"]) == 2
    err = capsys.readouterr().err
    assert "is a SAM ViT, which has no stage walk" in err and err.count("\n") == 1


@requires_timm
def test_a_timm_hub_folder_loads_and_converts_with_its_data_config(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    args = {**TINY, "global_attn_indexes": [1]}
    source = randomize(timm.create_model("samvit_base_patch16", **args))
    save_for_hf(source, str(tmp_path / "hub"), model_args=args, safe_serialization=True)
    model = load_pretrained(tmp_path / "hub")
    assert model.data_config.mean == pytest.approx((0.485, 0.456, 0.406))
    assert model.data_config.crop_pct == 1.0  # the .sa1b weights' cfg
    _same(model, source, 64)
    out = tmp_path / "converted.safetensors"
    assert cli.main(["convert", "--from", "timm", str(tmp_path / "hub"), str(out)]) == 0
    parity = capsys.readouterr().out.splitlines()[-1]
    assert parity.startswith("parity vs timm samvit_base_patch16 (") and "(ok," in parity
    _same(vitkit.load(out), source, 64)


def test_exports_other_than_onnx_at_one_size_are_refused_in_one_line(tmp_path, capsys):
    checkpoint = tmp_path / "sam.safetensors"
    vitkit.save(vitkit.create_model("samvit_base_patch16_224", **TINY, num_classes=2), checkpoint)
    refusals = {
        ("--format", "hf"): "Hugging Face's transformers has no model of a SAM image encoder",
        ("--format", "timm"): "vitkit writes no timm folder of a SAM ViT",
        ("--dynamic-img-size",): "a SAM ViT exports at a fixed image size",
    }
    for flags, message in refusals.items():
        out = tmp_path / "out"
        assert cli.main(["export", "--checkpoint", str(checkpoint), *flags, str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not out.exists()


@requires_onnx
def test_onnx_export_at_the_fixed_size_verifies(tmp_path, capsys):
    """The window attention's masked SDPA is written out under `torch.export` (torch's ONNX
    decomposition of SDPA with a mask fails on its output's strides)."""
    checkpoint = tmp_path / "sam.safetensors"
    vitkit.save(vitkit.create_model("samvit_base_patch16", **TINY, num_classes=2), checkpoint)
    onnx_file = tmp_path / "sam.onnx"
    argv = ["export", "--checkpoint", str(checkpoint), "--format", "onnx", str(onnx_file),
            "--verify"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert onnx_file.is_file() and "image size 64x64" in capsys.readouterr().out
