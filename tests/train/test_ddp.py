"""DistributedDataParallel on CPU: 2 processes with gloo through torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from vitkit import load
from vitkit.data import Transformed, load_data
from vitkit.train import evaluate, make_loader
from vitkit.train.distributed import all_reduce, all_reduce_tensor, distributed, world

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from vitkit import create_model
    from vitkit.data import Transformed, load_data
    from vitkit.train import ClassificationTask, TrainConfig, fit

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = create_model("vit_digits", embed_dim=32, depth=2, num_heads=2)
    splits = load_data("digits", seed=0)
    mean = torch.tensor(splits.mean).view(-1, 1, 1)
    std = torch.tensor(splits.std).view(-1, 1, 1)
    def norm(x):
        return (x - mean) / std
    torch.manual_seed(1 + rank)  # each rank draws its own augmentations
    config = TrainConfig(epochs=4, batch_size=32, lr=4e-3, warmup_epochs=0.5, mixup=0.0,
                         cutmix=0.0, seed=0)
    task = ClassificationTask(model, config, meta={"class_names": splits.class_names})
    result = fit(task, Transformed(splits.train, norm), Transformed(splits.val, norm), config,
                 out_dir=out)
    torch.save(model.state_dict(), f"{out}/rank{rank}.pt")
    with open(f"{out}/history{rank}.json", "w") as f:
        json.dump(result.history, f)
    dist.destroy_process_group()
    """
)


@pytest.fixture
def gloo_group():
    """A one-process gloo group in this process (no torchrun), left afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_reduction_returns_after_gloo_let_go_of_its_tensor(gloo_group):
    """gloo's worker thread drops its reference to a reduced tensor just after the result is
    ready; a reduction that returned before that left the last reference to a Python tensor on
    that thread, which at interpreter exit aborts the process (rank 1 of the torchrun CLI died
    of SIGABRT). Without the wait, about one reduction in five returns too early here."""
    early = 0
    for i in range(300):
        tensor = all_reduce_tensor(torch.full((3,), float(i), dtype=torch.float64))
        early += tensor._use_count() > 1
        assert tensor.tolist() == [float(i)] * 3
    assert early == 0


def test_reduction_without_the_private_use_count(gloo_group, monkeypatch):
    """Where torch has no `Tensor._use_count`, a reduction still sums and returns at once."""
    monkeypatch.setattr(torch.Tensor, "_use_count", None, raising=False)
    assert all_reduce_tensor(torch.ones(2)).tolist() == [1.0, 1.0]


def test_the_run_leaves_the_group_it_joined(monkeypatch):
    """`distributed` (the run folder's block) leaves the torchrun group it joined, also when
    the run fails or stops; a group joined before it is the caller's to leave."""
    join = dist.init_process_group
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda backend: join(backend, store=dist.HashStore(), rank=0, world_size=1),
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="failed run"), distributed("cpu") as device:
        assert device == "cpu" and dist.is_initialized()
        raise RuntimeError("failed run")
    assert not dist.is_initialized()
    join("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with distributed("cpu"):
            assert all_reduce([2.0], torch.device("cpu")) == [2.0]
        assert dist.is_initialized()  # the caller's group
    finally:
        dist.destroy_process_group()
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing to join
    with distributed("cpu"):
        assert world() == (0, 1)


def _torchrun(args, cwd, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.run(
        cmd + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_two_processes_end_with_identical_weights(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    proc = _torchrun([str(script), str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    w0 = torch.load(out / "rank0.pt", weights_only=True)
    w1 = torch.load(out / "rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    h0 = json.loads((out / "history0.json").read_text())
    h1 = json.loads((out / "history1.json").read_text())
    assert [r["val_acc1"] for r in h0] == [r["val_acc1"] for r in h1]  # reduced across ranks
    assert [r["train_loss"] for r in h0] == [r["train_loss"] for r in h1]
    # rank 0 alone wrote the run: one metrics row per epoch, the last weights saved
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 4
    last = load(out / "last.safetensors")
    assert all(torch.equal(last.state_dict()[k], w0[k]) for k in w0)
    # the reduced metric is the metric over the whole val split, and it is sensible
    splits = load_data("digits", seed=0)
    mean = torch.tensor(splits.mean).view(-1, 1, 1)
    std = torch.tensor(splits.std).view(-1, 1, 1)
    val = Transformed(splits.val, lambda x: (x - mean) / std)
    single = evaluate(last, make_loader(val, 64, train=False))
    assert single["acc1"] == pytest.approx(h0[-1]["val_acc1"])
    assert h0[-1]["val_acc1"] >= 0.3  # 4 epochs of a 2-block model: well above chance (0.1)
    assert h0[-1]["val_acc1"] > h0[0]["val_acc1"] or h0[0]["val_acc1"] >= 0.3


@pytest.mark.slow
def test_torchrun_cli_prints_once(tmp_path):
    proc = _torchrun(
        [
            "-m",
            "vitkit",
            "train",
            "--out",
            str(tmp_path / "run"),
            "--epochs",
            "1",
            "--model-opt",
            "depth=1",
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("test accuracy: ") for line in lines) == 1
    assert lines[-1].startswith("test accuracy: ")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["world_size"] == 2


MAE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from vitkit.train import MaeTask, PretrainConfig, fit

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = PretrainConfig(model="vit_digits", model_opts={"embed_dim": 32, "depth": 2,
                         "num_heads": 2}, epochs=3, batch_size=32, lr=2e-3, warmup_epochs=0.5,
                         decoder_dim=16, decoder_depth=1, decoder_heads=2, accum_steps=2)
    task = MaeTask.setup(config)  # seeds each rank's masks with seed + rank
    result = fit(task, task.train_set, task.val_set, config, out_dir=out)
    torch.save(task.model.state_dict(), f"{out}/rank{rank}.pt")
    with open(f"{out}/history{rank}.json", "w") as f:
        json.dump(result.history, f)
    dist.destroy_process_group()
    """
)


def test_mae_pretraining_under_torchrun(tmp_path):
    """MAE in the same engine: 2 gloo processes, gradient accumulation; both ranks end with
    the same weights, the losses are reduced across ranks, rank 0 writes the run."""
    script = tmp_path / "ddp_mae.py"
    script.write_text(MAE_SCRIPT)
    out = tmp_path / "run"
    proc = _torchrun([str(script), str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    w0 = torch.load(out / "rank0.pt", weights_only=True)
    w1 = torch.load(out / "rank1.pt", weights_only=True)
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    h0 = json.loads((out / "history0.json").read_text())
    h1 = json.loads((out / "history1.json").read_text())
    assert [r["train_loss"] for r in h0] == [r["train_loss"] for r in h1]
    assert [r["val_loss"] for r in h0] == [r["val_loss"] for r in h1]
    assert h0[-1]["train_loss"] < h0[0]["train_loss"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    encoder = load(out / "encoder.safetensors")
    assert all(torch.equal(v, w0[f"encoder.{k}"]) for k, v in encoder.state_dict().items())
    assert (out / "reconstructions.png").is_file()
