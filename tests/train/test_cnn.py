"""A timm CNN trained with `vitkit train --model timm:NAME`, saved, evaluated, predicted with,
and distilled into a ViT: DeiT's small-data recipe in two commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit import cli

TINY = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    pytest.importorskip("timm")
    out = tmp_path_factory.mktemp("cnn") / "run"
    argv = ["train", "--model", "timm:test_resnet", "--img-size", "32", "--epochs", "1"]
    assert cli.main([*argv, "--out", str(out), "--no-progress"]) == 0
    return out


def test_a_trained_cnn_loads_evaluates_and_predicts(resnet, tmp_path, capsys):
    timm = pytest.importorskip("timm")
    model = vitkit.load(resnet / "model.safetensors")
    assert isinstance(model, timm.models.ResNet) and model.num_classes == 10
    assert model.meta["class_names"] == [str(i) for i in range(10)]
    assert model.data_config.input_size == (1, 32, 32)
    record = json.loads((resnet / "config.json").read_text())
    assert record["model"] == {"name": "test_resnet", "num_classes": 10, "in_chans": 1}
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(resnet / "model.safetensors"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 359
    image = tmp_path / "digit.png"
    Image.fromarray(np.full((8, 8), 200, np.uint8)).save(image)
    assert cli.main(["predict", "--checkpoint", str(resnet / "model.safetensors"), str(image)]) == 0
    capsys.readouterr()
    for command in (["explain", "--output", str(tmp_path / "e.png")], ["export"]):
        argv = [command[0], "--checkpoint", str(resnet / "model.safetensors"), *command[1:]]
        assert (
            cli.main([*argv, str(image if command[0] == "explain" else tmp_path / "m.onnx")]) == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "holds a timm CNN (test_resnet)" in err


def test_distil_the_cnn_into_a_vit(resnet, tmp_path, capsys):
    out = tmp_path / "student"
    argv = ["train", "--teacher", str(resnet / "model.safetensors"), "--distill", "hard"]
    assert cli.main([*argv, "--epochs", "1", *TINY, "--out", str(out), "--no-progress"]) == 0
    assert vitkit.load(out / "model.safetensors").config.distilled


def test_a_doctored_cnn_file_is_refused_before_building(resnet, tmp_path):
    from safetensors.torch import load_file, safe_open, save_file

    source = resnet / "model.safetensors"
    with safe_open(str(source), framework="pt") as f:
        metadata = dict(f.metadata())
    spec = json.loads(metadata["vitkit_timm"])
    for change, pattern in (
        ({"num_classes": 7}, r"its timm model does not match its tensors \(wrong shape: fc"),
        ({"name": "no_such_net"}, r"timm has no model 'no_such_net'"),
        ({"num_classes": "x"}, r"invalid vitkit_timm metadata"),
    ):
        metadata["vitkit_timm"] = json.dumps({**spec, **change})
        path = tmp_path / "doctored.safetensors"
        save_file(load_file(str(source)), str(path), metadata=metadata)
        with pytest.raises(ValueError, match=pattern):
            vitkit.load(path)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--distill", "hard", "--teacher", "x.safetensors"], "distillation trains a ViT student"),
        (["--pretrained", "x.safetensors"], "--pretrained loads ViT weights"),
        (["--model-opt", "bogus=1"], "timm:test_resnet does not take these options"),
    ],
)
def test_cnn_mistakes_are_one_line(tmp_path, capsys, extra, message):
    pytest.importorskip("timm")
    argv = ["train", "--model", "timm:test_resnet", "--epochs", "1", "--out", str(tmp_path)]
    assert cli.main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
