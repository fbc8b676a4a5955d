"""TrainConfig is the one declaration of a training option: flags, settings files, validation
and recipes all come from its fields."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitkit import cli
from vitkit.train import RECIPES, TrainConfig, resolve_config
from vitkit.train.config import (
    FIELDS,
    GROUPS,
    GROWS,
    OPTIONAL,
    RUNTIME,
    Range,
    SettingsError,
    read_settings,
)
from vitkit.train.recipes import RECIPE_OPTIONS


def train_parser():
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices["train"]


def test_every_field_is_declared_with_help_and_a_group():
    for item in dataclasses.fields(TrainConfig):
        assert item.metadata["help"], item.name
        assert item.metadata["group"] in GROUPS, item.name
    assert set(GROUPS) == {"data", "optim", "finetune", "distill", "mae", "run"}


def test_help_shows_every_option_with_its_help_and_default():
    text = train_parser().format_help()
    for item in dataclasses.fields(TrainConfig):
        flag = "--" + (item.metadata["flag"] or item.name.replace("_", "-"))
        assert flag in text, flag
    assert "--epochs EPOCHS       passes over the training data (--resume may raise it)" in text
    assert (
        "--weight-decay WEIGHT_DECAY\n                        AdamW weight decay (default: 0.05)"
        in text
    )
    assert "--no-crop             resize instead of random crops" in text


def test_the_command_line_sets_only_what_it_names():
    args = cli.build_parser().parse_args(
        ["train", "--epochs", "3", "--img-size", "8", "--model-opt", "depth=2", "--no-crop"]
    )
    from vitkit.train.flags import given_options

    given = given_options(args)
    assert given == {
        "epochs": 3,
        "img_size": (8, 8),
        "model_opts": {"depth": 2},
        "crop_scale": None,
    }


def test_flags_over_file_over_recipe_over_defaults():
    config = resolve_config({"epochs": 3}, {"epochs": 7, "mixup": 0.1, "data": "digits"})
    assert config.epochs == 3 and config.mixup == 0.1  # flag, then file
    assert config.recipe == "small" and config.blr == RECIPES["small"]["blr"]  # recipe
    assert config.min_lr == TrainConfig().min_lr  # default
    assert config.model == "vit_digits"
    named = resolve_config({"data": "digits", "recipe": "deit"})
    assert named.recipe == "deit" and named.aa == TrainConfig().aa and named.epochs == 100
    with pytest.raises(ValueError, match="unknown recipe 'fast'; expected one of deit, small"):
        resolve_config({"recipe": "fast"})


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_a_valid_set_of_overrides(name):
    assert set(RECIPES[name]) <= set(FIELDS)
    config = TrainConfig(**RECIPES[name])
    assert all(getattr(config, k) == v for k, v in RECIPES[name].items())
    assert RECIPE_OPTIONS >= set(RECIPES[name])


def _outside(bounds: Range) -> float:
    return bounds.low - 1 if not bounds.low_open else bounds.low


@pytest.mark.parametrize(
    "item",
    [f for f in dataclasses.fields(TrainConfig) if f.metadata["range"] is not None],
    ids=lambda f: f.name,
)
def test_every_range_is_checked_with_a_message_naming_the_option(item):
    bounds = item.metadata["range"]
    pair = item.type.startswith("tuple[int, int]")  # each side is checked
    kind = int if pair or item.type in ("int", "int | None") else float
    value = kind(_outside(bounds))
    inside = kind(bounds.low) if not bounds.low_open else kind(bounds.low + 1)
    given = (inside, value) if pair else value
    with pytest.raises(ValueError, match=rf"^{item.name} .*, got {re.escape(repr(given))}$"):
        TrainConfig(**{item.name: given})
    if bounds.high is not None:
        too_big = kind(bounds.high + 1)
        with pytest.raises(ValueError, match=rf"^{item.name} "):
            TrainConfig(**{item.name: (too_big, inside) if pair else too_big})
    if kind is float:
        for bad in (math.nan, math.inf):
            with pytest.raises(ValueError, match=rf"^{item.name} must be a finite number"):
                TrainConfig(**{item.name: bad})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"amp": "fp8"}, "unknown amp 'fp8'; expected one of 'none', 'bf16', 'fp16'"),
        ({"distill": "yes"}, "unknown distill 'yes'; expected one of 'none', 'hard', 'soft'"),
        ({"in_chans": 2}, "unknown in_chans 2; expected one of 1, 3"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "split fractions [0.6, 0.5] add up"),
        ({"aa": "rand-x3"}, "unknown RandAugment field 'x3' in 'rand-x3'"),
        ({"data": "cifar.tar", "data_dir": "/x"}, "data_dir names the folder of a built-in"),
        ({"device": "gpu7"}, "device 'gpu7' is not a device; use cpu, cuda or cuda:N"),
        ({"lr": 1e-4, "min_lr": 1e-3}, "min_lr 0.001 is above lr 0.0001; the cosine decays"),
    ],
)
def test_cross_checks(options, message):
    with pytest.raises(ValueError, match=rf"^{message[:40].replace('[', '.').replace('(', '.')}"):
        TrainConfig(**options)


def test_types_are_checked_and_pairs_become_tuples():
    with pytest.raises(TypeError, match=r'^epochs must be an integer, got "3" \(str\)$'):
        TrainConfig(epochs="3")
    with pytest.raises(TypeError, match=r"^mixup must be a number, got true \(bool\)$"):
        TrainConfig(mixup=True)
    assert TrainConfig(img_size=[8, 6], crop_scale=[0.5, 1]).img_size == (8, 6)


def test_peak_lr_scales_the_base_rate_by_the_effective_batch():
    config = TrainConfig(blr=1e-3, batch_size=64, accum_steps=2)
    assert config.peak_lr() == pytest.approx(1e-3 * 128 / 512)
    assert config.peak_lr(world_size=4) == pytest.approx(1e-3 * 512 / 512)
    assert config.replace(lr=0.5).peak_lr(world_size=4) == 0.5


def test_settings_round_trip_and_old_runs_lack_only_later_options(tmp_path):
    config = TrainConfig(epochs=2, crop_scale=(0.5, 1.0), model_opts={"depth": 1})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"settings": config.to_dict()}))
    assert TrainConfig.from_dict(read_settings(path, complete=True)) == config
    old = {k: v for k, v in config.to_dict().items() if k not in OPTIONAL}
    path.write_text(json.dumps(old))
    assert TrainConfig.from_dict(read_settings(path, complete=True)) == config
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "epochs"}))
    with pytest.raises(SettingsError, match="missing setting.s. epochs; add them"):
        read_settings(path, complete=True)
    assert set(RUNTIME) == {"threads", "save_every", "device", "workers", "grad_ckpt"}
    assert set(GROWS) == {"epochs"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    tiny = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]
    assert cli.main(["train", "--out", str(out), "--epochs", "1", *tiny, "--no-progress"]) == 0
    return out


def test_resume_refuses_changed_settings_and_takes_runtime_ones(finished, capsys):
    code = cli.main(["train", "--out", str(finished), "--resume", "--lr", "0.1", "--seed", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(
        f"vitkit: error: --resume continues {finished} with its saved settings; it cannot change "
        "--seed (saved 0), --lr (unset in the run): drop them, or start a new run with --config"
    )
    code = cli.main(
        ["train", "--out", str(finished), "--resume", "--threads", "1", "--no-progress"]
    )
    assert code == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--epochs", "two"],
            "vitkit: error: --epochs invalid int value: 'two'; see `vitkit train --help`",
        ),
        (
            ["--amp", "fp32"],
            "vitkit: error: unknown amp 'fp32'; expected one of 'none', 'bf16', 'fp16'",
        ),
        (["--bogus"], "vitkit: error: unknown flag --bogus; see `vitkit train --help`"),
    ],
)
def test_command_line_mistakes_are_one_line(tmp_path, capsys, argv, message):
    code = cli.main(["train", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err == message + "\n"


NUMERIC = [
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.metadata["range"] is not None and "float" in str(f.type)
]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(name=st.sampled_from(NUMERIC), value=st.floats(allow_nan=True, allow_infinity=True))
def test_any_number_is_taken_only_inside_its_range(name, value):
    bounds = next(f for f in dataclasses.fields(TrainConfig) if f.name == name).metadata["range"]
    other = {"min_lr": 0.0} if name == "lr" else {}
    try:
        config = TrainConfig(**{name: value}, **other)
    except ValueError as err:
        assert str(err).startswith(name) and "\n" not in str(err)
        assert not (math.isfinite(value) and bounds.holds(value))
    else:
        assert math.isfinite(value) and bounds.holds(getattr(config, name))


def test_resume_may_raise_the_epochs_never_lower_them(tmp_path, capsys, caplog):
    """A finished 1-epoch run resumed with --epochs 2 trains one more epoch, records the new
    count in config.json and says what it took; fewer epochs than saved are refused."""
    out = tmp_path / "run"
    tiny = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]
    assert cli.main(["train", "--out", str(out), "--epochs", "2", *tiny, "--no-progress"]) == 0
    capsys.readouterr()
    code = cli.main(["train", "--out", str(out), "--resume", "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--epochs (saved 2); --epochs may only grow: drop them" in err
    caplog.set_level(logging.INFO, logger="vitkit")
    resume = ["train", "--out", str(out), "--resume", "--epochs", "3", "--no-progress"]
    assert cli.main(resume) == 0
    assert "--resume: taking --epochs 3 (saved 2)" in caplog.messages
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert json.loads((out / "config.json").read_text())["settings"]["epochs"] == 3
    assert json.loads((out / "test.json").read_text())["best_epoch"] in (1, 2, 3)
