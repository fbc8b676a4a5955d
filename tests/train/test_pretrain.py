"""`vitkit pretrain` (MAE): a run writes its encoder, metrics and reconstruction picture,
resumes to more epochs, refuses to mix with another run, and its encoder fine-tunes."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit import cli
from vitkit.train import MaeTask, PretrainConfig, load_state, run_job
from vitkit.train.lock import RunLockedError, run_lock
from vitkit.train.run_folder import read_run_config

TINY = ["--model-opt", "embed_dim=32", "--model-opt", "depth=2", "--model-opt", "num_heads=2"]
MAE = ["--decoder-dim", "16", "--decoder-depth", "1", "--decoder-heads", "2", "--no-progress"]


def test_pretrain_resume_and_fine_tune(tmp_path, capsys):
    out = tmp_path / "mae"
    argv = ["pretrain", "--out", str(out), "--epochs", "2", *TINY, *MAE]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert f"encoder in {out / 'encoder.safetensors'}" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert all(0 < row["train_loss"] < 10 and 0 < row["val_loss"] < 10 for row in rows)
    with Image.open(out / "reconstructions.png") as picture:
        assert picture.size[0] > 100 and picture.size[1] > 100

    assert cli.main(argv) == 2  # the folder holds a run
    assert (
        f"{out} already holds a run (state.pt, metrics.jsonl, metrics.csv, config.json"
        in capsys.readouterr().err
    )
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
    assert "unknown flag --layer-decay" in err  # not an MAE option


def test_pretrain_resumes_in_its_default_folder(tmp_path, monkeypatch, capsys):
    """Without --out, a run and its --resume use the same folder, runs/mae-<data>."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["pretrain", "--epochs", "1", *TINY, *MAE]) == 0, capsys.readouterr().err
    resume = ["pretrain", "--resume", "--epochs", "2", "--no-progress"]
    assert cli.main(resume) == 0, capsys.readouterr().err
    rows = (tmp_path / "runs" / "mae-digits" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1, 2]


# -- the engine's features, through run_pretraining --------------------------------------------


def mae_config(**options) -> PretrainConfig:
    base = dict(model="vit_digits", model_opts={"embed_dim": 32, "depth": 2, "num_heads": 2},
                epochs=2, batch_size=32, lr=1e-3, warmup_epochs=0.5, train_limit=320,
                decoder_dim=16, decoder_depth=1, decoder_heads=2, threads=1, amp="bf16",
                accum_steps=2, save_every=3, clip_grad=1.0)  # fmt: skip
    return PretrainConfig(**{**base, **options})


def test_mae_with_bf16_accumulation_save_every_and_a_sigterm_resumes_bit_for_bit(
    tmp_path, monkeypatch
):
    """bf16 autocast, 2 batches per step, a state every 3 steps; SIGTERM in the middle of
    epoch 2 saves the state there, and resuming ends with the uninterrupted run's weights."""
    full = run_job(MaeTask, mae_config(), tmp_path / "full")
    assert not full.result.interrupted and full.task == "mae"
    assert [r["epoch"] for r in full.result.history] == [1, 2]
    assert full.result.best_metric == "val_loss"

    saves = []
    fit_module = sys.modules["vitkit.train.fit"]  # the module (vitkit.train.fit is the function)
    real_save = fit_module.save_state

    def counted(state):
        saves.append((state.epoch, state.step, state.running.batches if state.running else 0))
        real_save(state)

    def progress(iterable, total, description):
        class Bar:
            def __iter__(self):
                yield from iterable

            def set_postfix(self, **values):
                self.seen = getattr(self, "seen", 0) + 1
                if description.startswith("epoch 2/") and self.seen == 4:  # batch 4 of 10
                    os.kill(os.getpid(), signal.SIGTERM)

        return Bar()

    monkeypatch.setattr(fit_module, "save_state", counted)
    cut = run_job(MaeTask, mae_config(), tmp_path / "cut", progress=progress)
    assert cut.result.interrupted and len(cut.result.history) == 1
    # 10 batches = 5 steps an epoch: saved at the start, at steps 3, 6 (mid-epoch), after epoch
    # 1, and at the stop (epoch 2, after batch 4 = step 7)
    assert saves == [(0, 0, 0), (0, 3, 6), (1, 5, 0), (1, 6, 2), (1, 7, 4)]
    state = load_state(tmp_path / "cut" / "state.pt")
    assert (state["epoch"], state["step"], state["epoch_state"]["batches"]) == (1, 7, 4)
    monkeypatch.undo()

    torch.manual_seed(123)  # the resumed run must not depend on the global seed
    resumed = run_job(MaeTask, read_run_config(tmp_path / "cut"), tmp_path / "cut", resume=True)
    assert [r["epoch"] for r in resumed.result.history] == [1, 2]
    a = load_file(tmp_path / "full" / "encoder.safetensors")
    b = load_file(tmp_path / "cut" / "encoder.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    whole = load_state(tmp_path / "full" / "state.pt")["model"]
    again = load_state(tmp_path / "cut" / "state.pt")["model"]
    assert all(torch.equal(whole[k], again[k]) for k in whole)  # the decoder too
    assert [r["val_loss"] for r in resumed.result.history] == [
        r["val_loss"] for r in full.result.history
    ]


def test_mae_respects_the_run_lock(tmp_path):
    out = tmp_path / "mae"
    out.mkdir()
    with run_lock(out):
        with pytest.raises(RunLockedError, match="is in use by a live vitkit run"):
            run_job(MaeTask, mae_config(epochs=1), out)
    assert not (out / "state.pt").exists()


def test_mae_sets_itself_up_without_the_classifier_s_builders(monkeypatch):
    """MAE's set-up builds a fresh encoder: it never enters the CNN builder, the teacher
    loader, pretrained weights or the timm architecture check."""
    import vitkit.train.tasks.classification as classification

    def refuse(*args, **kwargs):
        raise AssertionError("MAE's set-up entered a classifier's builder")

    for name in ("create_timm_classifier", "load_teacher", "load_pretrained", "check_arch",
                 "training_setup", "build_model"):  # fmt: skip
        monkeypatch.setattr(classification, name, refuse)
    tiny = {"embed_dim": 16, "depth": 1, "num_heads": 2}
    config = PretrainConfig(model="vit_digits", model_opts=tiny, decoder_dim=16,
                            decoder_depth=1, decoder_heads=2)  # fmt: skip
    task = MaeTask.setup(config)
    assert task.model.encoder.num_classes == 0 and task.sample.shape == (4, 1, 8, 8)
    assert task.meta == {"data": "digits", "model_name": "vit_digits", "mean": list(task.mean),
                         "std": list(task.std)}  # fmt: skip
    with pytest.raises(TypeError, match="MAE pretraining takes a PretrainConfig"):
        MaeTask.setup(vitkit.train.TrainConfig(model="vit_digits"))
    with pytest.raises(ValueError, match="MAE pretrains a ViT encoder; timm:resnet18 is a CNN"):
        MaeTask.setup(config.replace(model="timm:resnet18"))
