"""The run folder from the Python API: the resume policy (`resumed_config`), the record of the
job, and what `--overwrite` may remove."""

from __future__ import annotations

import json
import logging

import pytest

from vitkit.train import TrainConfig, run_training
from vitkit.train.pretrain import run_pretraining
from vitkit.train.run_folder import RunFolderError, read_run_config

TINY = {"embed_dim": 16, "depth": 1, "num_heads": 2}


def tiny_config(**options) -> TrainConfig:
    base = dict(model="vit_digits", model_opts=TINY, epochs=1, batch_size=64, lr=5e-3,
                warmup_epochs=0.0, mixup=0.0, cutmix=0.0, reprob=0.0, threads=1)  # fmt: skip
    return TrainConfig(**{**base, **options})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    run_training(tiny_config(epochs=2), out)
    return out


def test_resume_from_python_refuses_changed_settings(finished):
    given = tiny_config(lr=0.1, seed=3, clip_grad=1.0, epochs=3)
    with pytest.raises(RunFolderError) as err:
        run_training(given, finished, resume=True)
    assert str(err.value) == (
        f"resuming {finished} continues its saved settings; it cannot change seed (saved 0, "
        "given 3), lr (saved 0.005, given 0.1), clip_grad (saved unset, given 1.0): keep the "
        f"saved values, or start a new run from {finished / 'config.json'} with the new ones"
    )
    with pytest.raises(RunFolderError) as err:
        run_training(read_run_config(finished).replace(epochs=1), finished, resume=True)
    assert str(err.value).startswith(
        f"resuming {finished} continues its saved settings; it cannot change epochs (saved 2, "
        "given 1); epochs may only grow: keep the saved values"
    )


def test_resume_from_python_takes_runtime_options_and_more_epochs(tmp_path, caplog):
    out = tmp_path / "run"
    run_training(tiny_config(), out)
    saved = read_run_config(out)
    assert saved == tiny_config()
    caplog.set_level(logging.INFO, logger="vitkit")
    outcome = run_training(saved.replace(epochs=2, save_every=3, workers=0), out, resume=True)
    assert [row["epoch"] for row in outcome.result.history] == [1, 2]
    assert "resume: taking epochs 2 (saved 1)" in caplog.messages
    assert "resume: taking save_every 3 (saved 0)" in caplog.messages
    record = json.loads((out / "config.json").read_text())
    assert record["task"] == "classification" and record["settings"]["epochs"] == 2


def test_a_run_resumes_only_with_its_own_job(finished):
    with pytest.raises(RunFolderError) as err:
        run_pretraining(read_run_config(finished), finished, resume=True)
    assert str(err.value) == (
        f"{finished} holds a classification run, not a mae run; resume it with its own command"
    )
