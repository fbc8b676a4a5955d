"""Sharded training (--fsdp) and several processes on CPU with gloo: the loss trajectory of
FSDP and DDP against one process, sharded states resumed on another process count, the
refused combinations, and `vitkit pretrain --fsdp` under torchrun.

The tolerance of the trajectories, relative 1e-4: the runs see the same images in the same
order with the same augmentations (seeded per image), so they differ only in the order of
fp32 sums (a gradient reduced over 2 ranks instead of summed in one batch); that moves a loss
by ~1e-7 per step here, and 1e-4 still catches a wrong gradient scale (a factor 2 moves the
second epoch's loss by ~1e-2) or a missing reduction.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit import cli
from vitkit.train import TrainConfig, run_training, training_setup
from vitkit.train.distributed import distributed
from vitkit.train.fit import new_run_state
from vitkit.train.run_folder import read_run_config
from vitkit.train.sharded import full_state, is_sharded
from vitkit.train.state import load_state, restore
from vitkit.train.tasks import ClassificationTask

SRC = Path(__file__).resolve().parents[2] / "src"

# No random draw in the loss (no mixing, no dropout) and a constant learning rate (min_lr = lr),
# so a run of 2 epochs resumed to 3 takes the steps of a run of 3.
BASE = dict(
    model="vit_digits", model_opts={"embed_dim": 32, "depth": 2, "num_heads": 2},
    train_limit=128, val_fraction=0.05, test_fraction=0.05, epochs=2, batch_size=32, lr=1e-3,
    min_lr=1e-3, warmup_epochs=0.0, weight_decay=0.05,
    aa="none", reprob=0.0, mixup=0.0, cutmix=0.0, smoothing=0.1, hflip=0.5, threads=1,
    clip_grad=1.0,
)  # fmt: skip


def losses(out: Path) -> list[float]:
    """Each epoch's train and val loss, in a row."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows for key in ("train_loss", "val_loss")]


def test_fsdp_in_one_process_trains_as_without_it(tmp_path):
    """Alone (no torchrun) --fsdp joins a group of one: the same trajectory as a plain run
    (with activation checkpointing composed: the same gradients), a sharded state (a DCP
    folder named by state.pt), and an ordinary model file."""
    small = {**BASE, "train_limit": 64}
    plain = run_training(TrainConfig(**small), tmp_path / "plain")
    sharded = run_training(TrainConfig(**small, fsdp=True, grad_ckpt=True), tmp_path / "fsdp")
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "plain"), rel=1e-5)
    assert sharded.test["acc1"] == pytest.approx(plain.test["acc1"], abs=1e-9)
    saved = load_state(tmp_path / "fsdp" / "state.pt")
    assert saved["sharded"] == "state-2-0.dcp" and "model" not in saved
    assert [p.name for p in (tmp_path / "fsdp").glob("state-*.dcp")] == ["state-2-0.dcp"]
    model = vitkit.load(tmp_path / "fsdp" / "model.safetensors")
    reference = vitkit.load(tmp_path / "plain" / "model.safetensors")
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "what"),
    [({"compile": True}, "compile"), ({"ema": 0.99}, "ema"), ({"model": "timm:resnet18"}, "CNN")],
)
def test_fsdp_refuses_what_it_cannot_shard(options, what):
    with pytest.raises(ValueError, match=f"fsdp cannot be combined with .*{what}") as err:
        TrainConfig(**{**BASE, **options, "fsdp": True})
    assert "\n" not in str(err.value)


def test_a_torch_without_fsdp2_is_told_in_one_line_and_trains_without_it(monkeypatch):
    """Where torch lacks `fully_shard`, --fsdp is refused when the settings are read, and a
    run without it never asks for FSDP (`is_sharded` is False)."""
    from torch.distributed import fsdp

    monkeypatch.delattr(fsdp, "fully_shard")
    message = (
        r"^fsdp needs torch.distributed.fsdp.fully_shard, which torch .* lacks; upgrade torch "
        r"\(>= 2.6\) or train without fsdp$"
    )
    with pytest.raises(ValueError, match=message):
        TrainConfig(**BASE, fsdp=True)
    assert not is_sharded(torch.nn.Linear(2, 2))
    assert TrainConfig(**BASE).fsdp is False


def test_fsdp_may_not_change_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--epochs", "1", "--train-limit", "64", "--no-progress",
            "--model-opt", "embed_dim=32", "--model-opt", "depth=1",
            "--model-opt", "num_heads=2"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert cli.main(["train", "--out", str(out), "--resume", "--epochs", "2", "--fsdp"]) == 2
    assert "cannot change fsdp (saved false, given true)" in capsys.readouterr().err


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")


def _torchrun(args: list[str], cwd: Path, *, nproc: int = 2, timeout: int = 240):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
    ]
    return subprocess.run(
        cmd + args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch.distributed as dist
    from vitkit.train import TrainConfig, run_training
    from vitkit.train.run_folder import read_run_config

    base, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    if sys.argv[3] == "train":
        for name, extra in [("fsdp", {"fsdp": True}), ("ddp", {})]:
            run_training(TrainConfig(**{**base, **extra}), out / name)
    else:  # resume the sharded state on these processes, for a third epoch
        config = read_run_config(out / "fsdp").replace(epochs=3)
        run_training(config, out / "fsdp", resume=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_fsdp_and_ddp_follow_one_process_and_a_sharded_state_resumes_on_1_and_2(tmp_path):
    """2 processes of 32 images take the steps of 1 process of 64; the state a 2-process FSDP
    run saved after epoch 2 resumes on 2 processes (the uninterrupted run's epoch 3) and on 1
    (its whole weights and optimiser, resharded)."""
    script = tmp_path / "runs.py"
    script.write_text(SCRIPT)
    base = json.dumps(BASE)
    proc = _torchrun([str(script), base, str(tmp_path), "train"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_training(TrainConfig(**{**BASE, "batch_size": 64, "epochs": 3}), tmp_path / "one")
    one = losses(tmp_path / "one")
    assert losses(tmp_path / "fsdp") == pytest.approx(one[:4], rel=1e-4)
    assert losses(tmp_path / "ddp") == pytest.approx(one[:4], rel=1e-4)
    assert one[4] < one[2] < one[0]  # it learns

    shutil.copytree(tmp_path / "fsdp", tmp_path / "alone")
    saved_weights = vitkit.load(tmp_path / "fsdp" / "last.safetensors").state_dict()
    proc = _torchrun([str(script), base, str(tmp_path), "resume"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(tmp_path / "fsdp") == pytest.approx(one, rel=1e-4)

    # on 1 process: the weights and optimiser of the 2 shards, whole
    config = read_run_config(tmp_path / "alone")
    with distributed("cpu", alone=True):
        setup = training_setup(config)
        task = ClassificationTask(setup.model, config, meta={})
        state = new_run_state(task, config, batches_per_epoch=4, out=tmp_path / "alone")
        restore(state, load_state(tmp_path / "alone" / "state.pt"))
        assert is_sharded(state.model) and state.epoch == 2 and state.step == 4
        whole = full_state(state.model)
        assert whole.keys() == saved_weights.keys()
        assert all(torch.equal(whole[k], saved_weights[k]) for k in whole)
        steps = {int(v["step"]) for v in state.optimizer.state_dict()["state"].values()}
        assert steps == {4}
    argv = ["train", "--out", str(tmp_path / "alone"), "--resume", "--epochs", "3", "--no-progress"]
    assert cli.main(argv) == 0
    assert len(losses(tmp_path / "alone")) == 6


@pytest.mark.slow
def test_pretrain_with_fsdp_under_torchrun_writes_once(tmp_path):
    """`torchrun ... vitkit pretrain --fsdp`: one report, rank 0 writes the run (one metrics
    row per epoch), each log line names its rank, and the encoder file is whole."""
    out = tmp_path / "mae"
    proc = _torchrun(
        ["-m", "vitkit", "pretrain", "--fsdp", "--out", str(out), "--epochs", "2",
         "--train-limit", "128", "--model-opt", "embed_dim=32", "--model-opt", "depth=1",
         "--model-opt", "num_heads=2", "--decoder-dim", "16", "--decoder-depth", "1",
         "--decoder-heads", "2", "--grad-ckpt", "--no-progress"],
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum("encoder in" in line for line in proc.stdout.splitlines()) == 1
    # the encoder's block and the decoder's
    assert "[rank 0/2] FSDP: 2 blocks and the root sharded over 2 process(es), fp32" in proc.stderr
    assert [json.loads(r)["epoch"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    encoder = vitkit.load(out / "encoder.safetensors")
    assert encoder.config.embed_dim == 32 and len(encoder.blocks) == 1
    assert (out / "reconstructions.png").is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_loopback_train_one_run_and_its_model_predicts(tmp_path, capsys):
    """Two torchrun launches (--nnodes 2, one process each, static rendezvous on 127.0.0.1)
    share one run folder: global rank 0 alone takes the lock and writes, both end well, one
    report is printed, and the model it wrote predicts."""
    from PIL import Image

    port = _free_port()
    out = tmp_path / "run"
    launches = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "-m",
                "vitkit",
                "train",
                "--out",
                str(out),
                "--epochs",
                "1",
                "--train-limit",
                "128",
                "--model-opt",
                "embed_dim=32",
                "--model-opt",
                "depth=1",
                "--model-opt",
                "num_heads=2",
                "--no-progress",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for node in (0, 1)
    ]
    ended = [launch.communicate(timeout=240) for launch in launches]
    for launch, (_, err) in zip(launches, ended, strict=True):
        assert launch.returncode == 0, err[-3000:]
    reports = [line for stdout, _ in ended for line in stdout.splitlines()]
    assert sum(line.startswith("test accuracy: ") for line in reports) == 1
    assert "[rank 0/2 node 0] training vit_digits on digits" in ended[0][1]
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1

    image = tmp_path / "digit.png"
    Image.fromarray((torch.rand(8, 8) * 255).to(torch.uint8).numpy(), mode="L").save(image)
    capsys.readouterr()
    assert cli.main(["predict", "--checkpoint", str(out / "model.safetensors"), str(image)]) == 0
    printed = capsys.readouterr().out
    assert "digit.png" in printed and printed.count("\n") >= 2


def test_each_log_line_names_its_rank_and_node(monkeypatch):
    """Under torchrun the root logger's lines start with the global rank (and the node when
    there are several), once however often the group is joined."""
    import logging

    from vitkit.train.distributed import name_rank_in_logs

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    name_rank_in_logs(3, 4)
    name_rank_in_logs(3, 4)
    record = logging.LogRecord("vitkit", logging.WARNING, __file__, 1, "stopping", None, None)
    assert handler.format(record) == "[rank 3/4 node 1] WARNING stopping"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")  # one machine: no node
    handler.setFormatter(logging.Formatter("%(message)s"))
    name_rank_in_logs(0, 2)
    assert handler.format(record) == "[rank 0/2] stopping"

    # the group a run joined, and its names, are left at its end
    join = torch.distributed.init_process_group
    monkeypatch.setattr(
        torch.distributed, "init_process_group",
        lambda backend: join(backend, store=torch.distributed.HashStore(), rank=0, world_size=1),
    )  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    handler.setFormatter(logging.Formatter("%(message)s"))
    with distributed("cpu"):
        assert handler.format(record) == "[rank 0/1] stopping"
    assert handler.format(record) == "stopping"


@pytest.mark.slow
def test_a_sharded_run_stopped_after_a_save_every_save_resumes_as_if_uninterrupted(
    tmp_path, monkeypatch
):
    """A stop right after a `save_every` save keeps that DCP folder (it is not written
    again), and the run resumed from the middle of its epoch ends as the uninterrupted one."""
    from vitkit.train import fit
    from vitkit.train import sharded as sharded_module
    from vitkit.train import state as state_module
    from vitkit.train.signals import StopFlag

    config = TrainConfig(**{**BASE, "train_limit": 96, "epochs": 1, "fsdp": True, "save_every": 1})
    setup = training_setup(config)
    whole = fit(
        ClassificationTask(setup.model, config.replace(fsdp=False)),
        setup.train_set,
        setup.val_set,
        config.replace(fsdp=False),
    )

    written = []
    real_save = sharded_module.save_sharded

    def save_sharded(model, optimizer, out, name):
        written.append(name)
        return real_save(model, optimizer, out, name)

    monkeypatch.setattr(state_module, "save_sharded", save_sharded)
    stop = StopFlag()

    def progress(iterable, total, description):
        class Bar:
            def __iter__(self):
                yield from iterable

            def set_postfix(self, **values):
                stop.set("test")  # after the first step, which save_every=1 has saved

        return Bar()

    out = tmp_path / "run"
    with distributed("cpu", alone=True):
        cut = fit(
            ClassificationTask(training_setup(config).model, config),
            setup.train_set,
            setup.val_set,
            config,
            out_dir=out,
            stop=stop,
            progress=progress,
        )
        assert cut.interrupted
        assert written == ["state-0-0.dcp", "state-0-1.dcp"]  # the stop's save kept the step's
        assert load_state(out / "state.pt")["sharded"] == "state-0-1.dcp"
        resumed = fit(
            ClassificationTask(training_setup(config).model, config),
            setup.train_set,
            setup.val_set,
            config,
            out_dir=out,
            resume=True,
        )
    assert [p.name for p in out.glob("state-*.dcp")] == ["state-1-0.dcp"]
    assert resumed.history[0]["train_loss"] == pytest.approx(
        whole.history[0]["train_loss"], rel=1e-5
    )
    assert resumed.history[0]["val_loss"] == pytest.approx(whole.history[0]["val_loss"], rel=1e-5)
