"""Tar shards (`--data wds:PATTERN`) through the engine: a run trains and is evaluated, a run
killed with SIGKILL in the middle of an epoch resumes bit for bit, and two torchrun ranks read
their own shards."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_streams import killed_then_resumed

from _helpers import torchrun
from vitkit.cli import main
from vitkit.data.shards import write_shards
from vitkit.train import ClassificationTask, resolve_config, run_job

TINY = ("--model", "vit_digits", "--model-opt", "embed_dim=16", "--model-opt", "depth=1",
        "--model-opt", "num_heads=2", "--no-progress")  # fmt: skip


def shards(root: Path, per_class: int = 80, per_shard: int = 80) -> str:
    """Two classes of 6x5 RGB noise (the label shifts the brightness) as shards; the pattern."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(("dark", "light")):
        (root / "images" / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 128, (6, 5, 3)) + 127 * label
            Image.fromarray(pixels.astype(np.uint8)).save(root / "images" / name / f"{i}.png")
    out = str(root / "shards" / "train-%02d.tar")
    return write_shards(root / "images", out, per_shard=per_shard).pattern


def test_shards_train_and_evaluate(tmp_path, capsys):
    pattern = shards(tmp_path, per_class=20, per_shard=20)
    options = {"data": f"wds:{pattern}", "epochs": 1, "batch_size": 16, "lr": 5e-3,
               "model": "vit_digits", "model_opts": {"embed_dim": 16, "depth": 1,
                                                     "num_heads": 2}}  # fmt: skip
    outcome = run_job(ClassificationTask, resolve_config(options), tmp_path / "run")
    assert [row["epoch"] for row in outcome.result.history] == [1]
    assert outcome.test is not None and outcome.test["count"] == 8  # 20 % of 40
    assert outcome.result.corrupt_images == 0
    capsys.readouterr()
    code = main(["eval", "--checkpoint", str(tmp_path / "run"), "--data", f"wds:{pattern}",
                 "--json"])  # fmt: skip
    assert code == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["count"], row["part"]) == (8, "test split")


@pytest.mark.slow  # three runs with two loader workers, about 40 s on 2 busy cores
def test_sigkill_in_the_middle_of_an_epoch_then_resume_is_bit_identical(tmp_path):
    pattern = shards(tmp_path)  # 160 images: 128 to train, 8 batches of 16
    flags = ("--data", f"wds:{pattern}", "--epochs", "2", "--batch-size", "16", "--lr", "5e-3",
             "--val-fraction", "0.1", "--test-fraction", "0.1", "--workers", "2",
             "--crop-scale", "0.5", "1.0", "--hflip", "0.5", *TINY)  # fmt: skip
    # writes: before the first epoch, step 4, the end of epoch 1 (step 8): the second (epoch 1,
    # batch 4 of 8) is in place when the third is killed
    killed_then_resumed(tmp_path, flags, kill_at=3, saved_at=4)


TORCHRUN = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    from vitkit.data.shards import ShardStream
    from vitkit.train import ClassificationTask, resolve_config, run_job

    seen, apply = [], ShardStream.apply

    def recording(self, item):
        if self.keep is not None and len(self.keep) > 100:  # the training split
            seen.append(item[0])
        return apply(self, item)

    ShardStream.apply = recording
    out = Path(sys.argv[2])
    options = {"data": "wds:" + sys.argv[1], "epochs": 1, "batch_size": 16, "lr": 5e-3,
               "model": "vit_digits", "model_opts": {"embed_dim": 16, "depth": 1, "num_heads": 2}}
    run_job(ClassificationTask, resolve_config(options), out)
    (out / f"seen{os.environ['RANK']}.json").write_text(json.dumps(seen))
    """
)


@pytest.mark.slow  # torchrun, about 20 s on 2 busy cores
def test_each_torchrun_rank_reads_its_own_shards(tmp_path):
    pattern = shards(tmp_path)  # two shards of 80
    script = tmp_path / "shards_ddp.py"
    script.write_text(TORCHRUN)
    out = tmp_path / "run"
    proc = torchrun(str(script), pattern, str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    seen = [json.loads((out / f"seen{rank}.json").read_text()) for rank in range(2)]
    shard = [{where.split(":")[0] for where in keys} for keys in seen]
    assert shard == [{pattern.replace("{00..01}", "00")}, {pattern.replace("{00..01}", "01")}]
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) == len(seen[1]) == 56  # ceil(112 / 2): each rank its part of train
