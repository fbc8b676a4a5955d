"""The relative-position ViT's weights (weights/relpos/): timm's state dicts load (the keys tell
the family; the tensors show the sizes, the name what they cannot) and give timm's outputs
within 1e-5, also at another image size; a timm Hub folder loads; and the command line trains,
evaluates and predicts with one on the digits."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_onnx, requires_timm
from vitkit import CheckpointError, cli, load_pretrained
from vitkit.weights.families import reading_family

timm = optional_import("timm")
SMALL = dict(depth=2, embed_dim=48, num_heads=3, img_size=64)


def _timm(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomize(timm.create_model(name, **{**SMALL, **options}))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: int = 64) -> None:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


@requires_timm
@pytest.mark.parametrize(
    "name", ["vit_relpos_small_patch16_224", "vit_srelpos_small_patch16_224",
             "vit_relpos_base_patch16_clsgap_224"],
)  # fmt: skip
def test_a_timm_state_dict_loads_without_a_name_and_gives_timms_outputs(name):
    source = _timm(name)
    assert reading_family("timm", list(source.state_dict())).architectures == ("relpos",)
    model = load_pretrained(source.state_dict(), img_size=64)
    assert type(model).__name__ == "RelPosViT" and model.config.num_heads == 3
    _same(model, source)


@requires_timm
def test_what_the_keys_cannot_tell_comes_from_the_name():
    """Post-norm blocks and class-token pooling are the name's; without it timm's defaults."""
    for name in ("vit_relpos_small_patch16_rpn_224", "vit_relpos_medium_patch16_cls_224"):
        source = _timm(name)
        model = load_pretrained(source.state_dict(), arch=name, img_size=64)
        _same(model, source)
    with pytest.raises(CheckpointError, match=r"^the weights are not 'vit_tiny_patch16_224'"):
        load_pretrained(source.state_dict(), arch="vit_tiny_patch16_224")


@requires_timm
def test_another_image_size_gives_timms_model_at_that_size():
    source = _timm("vit_relpos_small_patch16_224")
    theirs = timm.create_model("vit_relpos_small_patch16_224", **{**SMALL, "img_size": 96})
    theirs.load_state_dict(source.state_dict())
    model = load_pretrained(source.state_dict(), img_size=96)
    _same(model, theirs.eval(), 96)
    assert load_pretrained(source.state_dict(), num_classes=3).head.out_features == 3


@requires_timm
def test_a_timm_hub_folder_loads(tmp_path):
    from timm.models._hub import save_for_hf

    source = _timm("vit_relpos_small_patch16_rpn_224")
    save_for_hf(source, str(tmp_path / "hub"), model_args=SMALL, safe_serialization=True)
    model = load_pretrained(tmp_path / "hub")
    assert model.config.res_post_norm and model.data_config.mean == pytest.approx((0.5,) * 3)
    _same(model, source)


def test_train_eval_predict_on_the_digits(tmp_path, capsys):
    from PIL import Image

    run = tmp_path / "run"
    argv = ["train", "--data", "digits", "--model", "vit_relpos_small_patch16_224",
            "--img-size", "32", "--model-opt", "patch_size=4", "--model-opt", "embed_dim=16",
            "--model-opt", "depth=1", "--model-opt", "num_heads=2", "--epochs", "1",
            "--batch-size", "128", "--out", str(run), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(run / "model.safetensors")
    assert type(model).__name__ == "RelPosViT" and model.config.num_classes == 10
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(run), "--data", "digits", "--json"]) == 0
    assert '"count": 359' in capsys.readouterr().out
    image = tmp_path / "x.png"
    Image.new("RGB", (32, 32)).save(image)
    assert cli.main(["predict", "--checkpoint", str(run), str(image)]) == 0
    assert capsys.readouterr().out.startswith(f"{image}: ")


@requires_onnx
def test_onnx_export_verifies(tmp_path, capsys):
    checkpoint = tmp_path / "relpos.safetensors"
    model = vitkit.create_model("vit_relpos_medium_patch16_cls_224", **SMALL, num_classes=2)
    vitkit.save(model, checkpoint)
    onnx_file = tmp_path / "relpos.onnx"
    argv = ["export", "--checkpoint", str(checkpoint), "--format", "onnx", str(onnx_file),
            "--verify"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert onnx_file.is_file() and "image size 64x64" in capsys.readouterr().out
