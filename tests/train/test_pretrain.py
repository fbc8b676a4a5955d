"""`vitkit pretrain` (MAE): a run writes its encoder, metrics and reconstruction picture,
resumes to more epochs, refuses to mix with another run, and its encoder fine-tunes."""

from __future__ import annotations

import json

import torch
from PIL import Image

import vitkit
from vitkit import cli

TINY = ["--model-opt", "embed_dim=32", "--model-opt", "depth=2", "--model-opt", "num_heads=2"]
MAE = ["--decoder-dim", "16", "--decoder-depth", "1", "--decoder-heads", "2", "--no-progress"]


def test_pretrain_resume_and_fine_tune(tmp_path, capsys):
    out = tmp_path / "mae"
    argv = ["pretrain", "--out", str(out), "--epochs", "2", *TINY, *MAE]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert f"encoder in {out / 'encoder.safetensors'}" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert all(0 < row["loss"] < 10 for row in rows)
    with Image.open(out / "reconstructions.png") as picture:
        assert picture.size[0] > 100 and picture.size[1] > 100

    assert cli.main(argv) == 2  # the folder holds a run
    assert f"{out} already holds a run (config.json" in capsys.readouterr().err
    resume = ["pretrain", "--out", str(out), "--resume", "--epochs", "3", "--no-progress"]
    assert cli.main(resume) == 0, capsys.readouterr().err
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert resumed[:2] == rows and resumed[2]["epoch"] == 3

    encoder = vitkit.load(out / "encoder.safetensors")
    assert encoder.config.num_classes == 0 and encoder.config.embed_dim == 32
    run = tmp_path / "fine"
    train = ["train", "--pretrained", str(out / "encoder.safetensors"), "--out", str(run)]
    assert cli.main([*train, "--epochs", "1", "--no-progress"]) == 0
    tuned = vitkit.load(run / "model.safetensors")
    assert tuned.config.num_classes == 10
    for key in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight"):
        assert not torch.equal(tuned.state_dict()[key], encoder.state_dict()[key])  # trained on
        assert tuned.state_dict()[key].shape == encoder.state_dict()[key].shape


def test_pretrain_refuses_fine_tuning_options(tmp_path, capsys):
    argv = ["pretrain", "--out", str(tmp_path / "mae"), "--layer-decay", "0.7", "--freeze", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unrecognized arguments: --layer-decay 0.7 --freeze 1" in err  # not MAE options


def test_pretrain_resumes_in_its_default_folder(tmp_path, monkeypatch, capsys):
    """Without --out, a run and its --resume use the same folder, runs/mae-<data>."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["pretrain", "--epochs", "1", *TINY, *MAE]) == 0, capsys.readouterr().err
    resume = ["pretrain", "--resume", "--epochs", "2", "--no-progress"]
    assert cli.main(resume) == 0, capsys.readouterr().err
    rows = (tmp_path / "runs" / "mae-digits" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1, 2]
