"""`vitkit train --config FILE` and the config.json read on `--resume`: a run's settings
re-used exactly, flags over the file over the recipe, and one line for a file that is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _run import TINY

from vitkit import cli
from vitkit.train import TrainConfig
from vitkit.train.config import FIELDS

RUN = (*TINY, "--epochs", "1")


def settings(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["settings"]


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """A run with many settings away from their defaults."""
    out = tmp_path_factory.mktemp("first") / "run"
    argv = ["train", "--out", str(out), *RUN, "--mixup", "0.2", "--seed", "3", "--ema", "0.9"]
    argv += ["--clip-grad", "1.0", "--val-fraction", "0.15", "--save-every", "7"]
    assert cli.main([*argv, "--img-size", "8", "--model-opt", "drop_rate=0.1"]) == 0
    return out


def test_a_runs_config_reproduces_its_settings(tmp_path, run_cli, first):
    code, _, _ = run_cli("train", "--config", first / "config.json", "--out", tmp_path / "again")
    assert code == 0
    assert settings(tmp_path / "again") == settings(first)


def test_flags_override_the_file(tmp_path, run_cli, first):
    out = tmp_path / "run"
    argv = ["--config", first / "config.json", "--out", out, "--seed", "0", "--mixup", "0.8"]
    code, _, _ = run_cli("train", *argv, "--model-opt", "drop_rate=0.0")
    assert code == 0
    expected = {**settings(first), "seed": 0, "mixup": 0.8, "model_opts": {"drop_rate": 0.0}}
    assert settings(out) == expected


def test_a_flat_file_over_the_recipe(tmp_path, run_cli):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"mixup": 0, "cutmix": 0.0, "clip_grad": None, "threads": 2}))
    code, _, _ = run_cli("train", "--config", path, "--out", tmp_path / "run", *RUN)
    assert code == 0
    got = settings(tmp_path / "run")
    assert (got["mixup"], got["cutmix"], got["clip_grad"], got["threads"]) == (0, 0.0, None, 2)
    assert got["epochs"] == 1 and got["drop_path"] == 0.1  # a flag, and the recipe's value


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"epochs": "10"}', '"epochs" must be an integer, got "10" (str)'),
        ('{"batch_size": true}', '"batch_size" must be an integer, got true (bool)'),
        ('{"epochs": 2.5}', '"epochs" must be an integer, got 2.5 (float)'),
        ('{"seed": null}', '"seed" must be an integer, got null (null)'),
        ('{"lr": "fast"}', '"lr" must be a number or null, got "fast" (str)'),
        ('{"compile": 1}', '"compile" must be true or false, got 1 (int)'),
        (
            '{"img_size": [8, "8"]}',
            '"img_size" must be a list of integers or null, got [8, "8"] (list)',
        ),
        ('{"model_opts": ["depth=1"]}', '"model_opts" must be an object, got ["depth=1"] (list)'),
        (
            '{"epoch": 3, "lrr": 0.1, "colour": 1}',
            'unknown setting(s) "epoch" (did you mean "epochs"?), "lrr" (did you mean "lr"?), '
            '"colour"; the names are those of `vitkit train --help` with _ for -',
        ),
        ('{"epochs": 3,\n "lr": }', "invalid JSON at line 2, column 8: Expecting value"),
        ("[1, 2]", "expected a JSON object of settings, got [1, 2] (list)"),
        ('{"settings": 3}', 'unknown setting(s) "settings"; the names are those of'),
    ],
)
def test_a_wrong_config_file_is_one_line(tmp_path, run_cli, text, message):
    path = tmp_path / "run.json"
    path.write_text(text)
    code, stdout, err = run_cli("train", "--config", path, "--out", tmp_path / "run", *RUN)
    assert (code, stdout) == (2, "")
    assert err.startswith(f"vitkit: error: --config {path}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_config_file_that_is_missing_or_combined_with_resume(tmp_path, run_cli):
    path = tmp_path / "nope.json"
    code, _, err = run_cli("train", "--config", path, "--out", tmp_path / "run")
    assert (code, err) == (2, f"vitkit: error: --config {path}: no such file\n")
    code, _, err = run_cli("train", "--config", path, "--resume", "--out", tmp_path / "run")
    assert code == 2 and err.startswith(
        "vitkit: error: --config starts a new run from a settings file"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.update(epochs="3"), '"epochs" must be an integer, got "3" (str)'),
        (lambda s: s.pop("batch_size"), "missing setting(s) batch_size; add them, or start"),
        (lambda s: s.update(warmup=1), 'unknown setting(s) "warmup" (did you mean "warmup_'),
    ],
)
def test_a_hand_edited_config_json_on_resume(tmp_path, run_cli, first, edit, message):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("config.json", "state.pt"):
        (out / name).write_bytes((first / name).read_bytes())
    record = json.loads((out / "config.json").read_text())
    edit(record["settings"])
    (out / "config.json").write_text(json.dumps(record))
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert code == 2 and err.startswith(f"vitkit: error: {out / 'config.json'}: {message}")
    (out / "config.json").write_text('{"settings": {"epochs": 3,}}')
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert err.startswith(
        f"vitkit: error: {out / 'config.json'}: invalid JSON at line 1, column 27: "
    )


def test_an_older_runs_config_json_resumes(tmp_path, run_cli, first):
    """Runs saved before --save-every existed lack it: they resume with its old value, 0."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("config.json", "state.pt", "last.safetensors", "model.safetensors"):
        (out / name).write_bytes((first / name).read_bytes())
    record = json.loads((out / "config.json").read_text())
    del record["settings"]["save_every"]
    (out / "config.json").write_text(json.dumps(record))
    code, stdout, _ = run_cli("train", "--out", out, "--resume", "--no-progress")
    assert code == 0 and stdout.splitlines()[-1].startswith("test accuracy: ")


def test_every_option_is_a_flag_and_a_setting(first):
    """TrainConfig is the one declaration: each field is a `vitkit train` flag, a key of the
    settings a run records, and a value the settings reader checks."""
    parser = cli.build_parser()
    train = next(a for a in parser._actions if a.dest == "command").choices["train"]
    dests = {action.dest for action in train._actions}
    assert set(FIELDS) <= dests
    assert set(settings(first)) == set(FIELDS) - {"device"}
    assert TrainConfig.from_dict(settings(first)).to_dict() == {**settings(first), "device": None}
