"""Hugging Face datasets through the engine: a saved dataset trains map-style and is
evaluated, and a streamed one (`hfids:`) killed with SIGKILL in the middle of an epoch
resumes bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_streams import killed_then_resumed

from vitkit.cli import main
from vitkit.train import ClassificationTask, resolve_config, run_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_hf_datasets import png, table  # noqa: E402

pytestmark = pytest.mark.requires("datasets", extra="datasets")
TINY = ("--model", "vit_digits", "--model-opt", "embed_dim=16", "--model-opt", "depth=1",
        "--model-opt", "num_heads=2", "--no-progress")  # fmt: skip


def test_a_saved_dataset_trains_and_is_evaluated(tmp_path, capsys):
    table(40).save_to_disk(tmp_path / "saved")
    options = {"data": f"hfds:{tmp_path / 'saved'}", "epochs": 1, "batch_size": 16, "lr": 5e-3,
               "model": "vit_digits", "model_opts": {"embed_dim": 16, "depth": 1,
                                                     "num_heads": 2}}  # fmt: skip
    outcome = run_job(ClassificationTask, resolve_config(options), tmp_path / "run")
    assert [row["epoch"] for row in outcome.result.history] == [1]
    assert outcome.test is not None and outcome.test["count"] == 8  # 20 % of 40
    capsys.readouterr()
    code = main(["eval", "--checkpoint", str(tmp_path / "run"), "--json"])  # its own data
    assert code == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["count"], row["part"]) == (8, "test split")


def test_the_columns_a_run_read_are_the_ones_eval_reads(tmp_path, capsys):
    """A table whose columns must be named (`file`, `kind`) trains with --image-column and
    --label-column; `vitkit eval` of the run folder reads the same columns unasked."""
    for i in range(20):
        (tmp_path / f"{i}.png").write_bytes(png(120 * (i % 2), i))
    lines = ["file,kind"] + [f"{i}.png,{('dark', 'light')[i % 2]}" for i in range(20)]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    data, run = f"hfds:csv:{tmp_path / 'list.csv'}", tmp_path / "run"
    assert main(["train", "--data", data, "--image-column", "file", "--label-column", "kind",
                 "--epochs", "1", "--batch-size", "8", "--out", str(run), *TINY]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["count"], row["part"]) == (4, "test split")


@pytest.mark.slow  # three runs, about 30 s on 2 busy cores
def test_a_stream_killed_in_the_middle_of_an_epoch_resumes_bit_for_bit(tmp_path):
    table(160).to_parquet(tmp_path / "data.parquet")  # 128 to train: 8 batches of 16
    flags = ("--data", f"hfids:{tmp_path / 'data.parquet'}", "--epochs", "2", "--batch-size",
             "16", "--lr", "5e-3", "--val-fraction", "0.1", "--test-fraction", "0.1",
             "--crop-scale", "0.5", "1.0", "--hflip", "0.5", *TINY)  # fmt: skip
    # writes: before the first epoch, step 4, the end of epoch 1 (step 8): the second (epoch 1,
    # batch 4 of 8) is in place when the third is killed
    killed_then_resumed(tmp_path, flags, kill_at=3, saved_at=4)
