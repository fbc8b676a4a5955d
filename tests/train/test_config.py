"""The job configs (`TrainConfig`, `PretrainConfig`) are the one declaration of a training
option: each command's flags, settings files (`--config`, the config.json read on
`--resume`), validation and recipes all come from their fields; the model options are those
of the chosen model's architecture (`--model-opt KEY=VALUE`, checked by its schema), with
flags only for the few every architecture has."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitkit import cli
from vitkit.model import ViTConfig
from vitkit.options import Range, SettingsError, option_fields, option_names, read_settings
from vitkit.options.flags import given_options
from vitkit.train import RECIPES, PretrainConfig, TrainConfig, resolve_config
from vitkit.train.config import JobConfig
from vitkit.train.recipes import RECIPE_OPTIONS

TINY = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
        "--lr", "5e-3", "--batch-size", "64", "--warmup-epochs", "0.5",
        "--no-progress"]  # fmt: skip
RUN = [*TINY, "--epochs", "1"]
# The options only a classifier's training has, and only MAE's.
CLASSIFIER_ONLY = {
    "aa", "reprob", "mixup", "cutmix", "mix_prob", "switch_prob", "smoothing", "ema",
    "pretrained", "pos_resample", "layer_decay", "freeze", "linear_probe",
    "teacher", "teacher_weights", "distill", "distill_alpha", "distill_tau",
    "multi_label", "multi_label_loss", "threshold",
}  # fmt: skip
MAE_ONLY = {"mask_ratio", "decoder_dim", "decoder_depth", "decoder_heads", "norm_pix"}


def parser_of(command: str):
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices[command]


def flags_of(command: str) -> set[str]:
    return {flag for action in parser_of(command)._actions for flag in action.option_strings}


def run(capsys, *argv) -> tuple[int, str, str]:
    """`vitkit ARGV` in this process: (exit code, stdout, stderr), never a traceback."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def settings_of(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["settings"]


# -- the fields -----------------------------------------------------------------------------


@pytest.mark.parametrize("job", [TrainConfig, PretrainConfig])
def test_every_field_is_declared_with_help_and_a_group(job):
    for item in dataclasses.fields(job):
        assert item.metadata["help"], item.name
        assert item.metadata["group"] in JobConfig.GROUPS, item.name


def test_each_job_has_its_own_options():
    shared = set(option_names(JobConfig))
    assert set(option_names(TrainConfig)) == shared | CLASSIFIER_ONLY
    assert set(option_names(PretrainConfig)) == shared | MAE_ONLY
    assert {"epochs", "lr", "accum_steps", "amp", "compile", "grad_ckpt", "save_every",
            "crop_scale", "hflip", "model_opts", "threads", "workers"} <= shared  # fmt: skip
    assert not {"img_size", "in_chans", "drop_path"} & shared  # model options now


# The model options every architecture has: the only ones with flags of their own.
SHARED_MODEL_FLAGS = {"--img-size", "--in-chans", "--drop-path-rate"}


def test_train_help_has_the_shared_model_flags_only_and_is_short(capsys):
    text = parser_of("train").format_help()
    flags = flags_of("train")
    vit_only = {"--" + n.replace("_", "-") for n in option_names(ViTConfig)} - SHARED_MODEL_FLAGS
    assert SHARED_MODEL_FLAGS | {"--model-opt"} <= flags and not vit_only & flags
    assert not {"--depth", "--embed-dim", "--window-size", "--class-token", "--no-class-token",
                "--num-classes"} & flags  # fmt: skip
    for name in CLASSIFIER_ONLY - {"distill"}:
        assert "--" + name.replace("_", "-") in flags, name
    assert not {"--mask-ratio", "--decoder-dim", "--decoder-depth", "--norm-pix"} & flags
    assert not {"--drop-path", "--no-norm-pix"} & flags
    assert len(text.splitlines()) < 200  # was 401 with every ViT option a flag (186 with the
    # data columns, multi-label and --quiet)
    assert text.startswith("usage: vitkit train [FLAGS]\n")
    assert "--epochs N            passes over the training data (--resume may raise it)" in text
    assert "--weight-decay X      AdamW weight decay (default: 0.05)" in text
    assert "--no-crop             resize instead of random crops" in text
    assert "default: the preset's (recipes may change it)" in " ".join(text.split())
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[0] != " "]
    assert titles == [
        "options", "data", "model", "optimisation (unset: the recipe's value)",
        "augmentation and regularisation (unset: the recipe's value)",
        "fine-tuning (with --pretrained)", "distillation (DeiT)",
        "multi-label classification (one-vs-rest)", "how the run executes", "this invocation",
    ]  # fmt: skip


def test_pretrain_help_has_no_classifier_options():
    flags = flags_of("pretrain")
    classifier = {"--" + n.replace("_", "-") for n in CLASSIFIER_ONLY}
    assert not classifier & flags
    assert {"--mask-ratio", "--decoder-dim", "--norm-pix", "--no-norm-pix", "--amp",
            "--accum-steps", "--save-every", "--compile", *SHARED_MODEL_FLAGS} <= flags  # fmt: skip
    assert "--depth" not in flags
    text = parser_of("pretrain").format_help()
    assert "fine-tuning (with --pretrained):" not in text and "distillation (DeiT):" not in text


def test_the_command_line_sets_only_what_it_names():
    args = cli.build_parser().parse_args(
        ["train", "--epochs", "3", "--img-size", "8", "--model-opt", "depth=2", "--no-crop",
         "--model-opt", "class_token=false", "--model-opt", "global_pool=avg", "--model-opt",
         "patch_size=2,4", "--drop-path-rate", "0.2"]
    )  # fmt: skip
    given = given_options(args, TrainConfig)
    assert given == {
        "epochs": 3,
        "model_opts": {
            "img_size": 8,
            "depth": 2,
            "class_token": False,
            "global_pool": "avg",
            "patch_size": "2,4",  # typed by the model's schema once the model is known
            "drop_path_rate": 0.2,
        },  # fmt: skip
        "crop_scale": None,
    }
    assert resolve_config(given).model_opts["patch_size"] == (2, 4)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--img-size", "8", "--model-opt", "img_size=16"],
         "--img-size and --model-opt img_size=... both set img_size; give it once"),
        (["--in-chans", "x"], "--in-chans must be an integer, got 'x'; see `vitkit train --help`"),
        (["--model-opt", "depth=x"], 'depth must be an integer, got "x" (str)'),
        (["--model-opt", "depth=0"], "depth must be in [1, 1024], got 0"),
        (["--model-opt", "mlp_ratio=0"], "mlp_ratio must be > 0, got 0"),
        (["--model-opt", "dept=3"], "unknown option 'dept' for the ViT vit_digits; close: depth; "
         "see vitkit models vit_digits --options"),
        (["--img-size", "8", "8", "8"], "--img-size takes 1 or 2 values, got 3"),
        (["--model-opt", "global_pool=gem"],
         "unknown global_pool 'gem'; expected one of 'token', 'avg'"),
        (["--model", "swin_tiny_patch4_window7_224", "--model-opt", "depth=2"],
         "unknown option 'depth' for the Swin Transformer swin_tiny_patch4_window7_224; close: "
         "depths; see vitkit models swin_tiny_patch4_window7_224 --options\n"),
        (["--model", "swin_tiny_patch4_window7_224", "--model-opt", "depths=2,0,2,2"],
         "depths must be in [1, 1024], got (2, 0, 2, 2)\n"),
        (["--model", "swin_tiny_patch4_window7_224", "--model-opt", "global_blocks=2"],
         "unknown option 'global_blocks' for the Swin Transformer"),
    ],
)  # fmt: skip
def test_a_bad_model_option_is_one_line(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, "train", "--out", tmp_path / "run", *argv)
    assert (code, out) == (2, "") and err.startswith(f"vitkit: error: {message}")
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


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


def test_model_options_merge_key_by_key_under_the_file_and_the_command_line():
    file = {"model_opts": {"depth": 2, "drop_path_rate": 0.2, "drop_rate": 0.1}}
    given = {"model_opts": {"depth": 3}}
    config = resolve_config(given, file)
    assert config.model_opts == {"drop_path_rate": 0.2, "depth": 3, "drop_rate": 0.1}
    assert resolve_config({}).model_opts == {"drop_path_rate": 0.1}  # the small recipe's
    fashion = resolve_config({"data": "fashion-mnist", "model_opts": {"depth": 1}})
    assert fashion.model_opts == {"depth": 1}  # its recipe leaves the preset's rate (0)
    cnn = resolve_config({"model": "timm:resnet18", "model_opts": {"any_timm_option": 1}})
    assert cnn.model_opts == {"drop_path_rate": 0.1, "any_timm_option": 1}  # timm's to check


# The stochastic depth each recipe trains with: DeiT's 0.1 but for the 28x28 recipes (whose
# models then keep their preset's rate, 0); a seeded run's weights depend on it.
DROP_PATH = {"deit": 0.1, "small": 0.1, "fashion-mnist": None, "mnist": None, "mnist-5k": 0.1,
             "finetune": 0.1}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_is_a_valid_set_of_overrides(name):
    assert set(RECIPES[name]) <= set(option_names(TrainConfig))
    config = TrainConfig(**RECIPES[name])
    assert all(getattr(config, k) == v for k, v in RECIPES[name].items())
    assert RECIPE_OPTIONS >= set(RECIPES[name]) - {"model_opts"}
    assert config.model_opts.get("drop_path_rate") == DROP_PATH[name]
    resolved = resolve_config({"recipe": name}, job=PretrainConfig)  # MAE takes what it has
    assert resolved.model_opts.get("drop_path_rate") == DROP_PATH[name]
    assert resolved.epochs == RECIPES[name].get("epochs", 100)


def _outside(bounds: Range) -> float:
    return bounds.low - 1 if not bounds.low_open else bounds.low


RANGED = [
    pytest.param(job, f, id=f"{job.__name__}.{f.name}")
    for job in (TrainConfig, PretrainConfig)
    for f in dataclasses.fields(job)
    if f.metadata["range"] is not None and (job is TrainConfig or f.name in MAE_ONLY)
]


@pytest.mark.parametrize("job, item", RANGED)
def test_every_range_is_checked_with_a_message_naming_the_option(job, item):
    bounds = item.metadata["range"]
    kind = int if item.type in ("int", "int | None") else float
    value = kind(_outside(bounds))
    inside = kind(bounds.low if not bounds.low_open else (bounds.low + (bounds.high or 2)) / 2)
    with pytest.raises(ValueError, match=rf"^{item.name} .*, got {re.escape(repr(value))}$"):
        job(**{item.name: value})
    job(**{item.name: inside})
    if bounds.high is not None:
        with pytest.raises(ValueError, match=rf"^{item.name} "):
            job(**{item.name: kind(bounds.high + 1)})
    if kind is float:
        for bad in (math.nan, math.inf):
            with pytest.raises(ValueError, match=rf"^{item.name} must be a finite number"):
                job(**{item.name: bad})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"amp": "fp8"}, "unknown amp 'fp8'; expected one of 'none', 'bf16', 'fp16'"),
        ({"distill": "yes"}, "unknown distill 'yes'; expected one of 'none', 'hard', 'soft'"),
        ({"model_opts": {"in_chans": 0}}, "in_chans must be in [1, 4096], got 0"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "split fractions [0.6, 0.5] add up"),
        ({"aa": "rand-x3"}, "unknown RandAugment field 'x3' in 'rand-x3'"),
        ({"data": "cifar.tar", "data_dir": "/x"}, "data_dir names the folder of a built-in"),
        ({"device": "gpu7"}, "device 'gpu7' is not a device; use cpu, cuda or cuda:N"),
        ({"lr": 1e-4, "min_lr": 1e-3}, "min_lr 0.001 is above lr 0.0001; the cosine decays"),
    ],
)
def test_cross_checks(options, message):
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}"):
        TrainConfig(**options)


def test_types_are_checked_and_pairs_become_tuples():
    with pytest.raises(TypeError, match=r'^epochs must be an integer, got "3" \(str\)$'):
        TrainConfig(epochs="3")
    with pytest.raises(TypeError, match=r"^mixup must be a number, got true \(bool\)$"):
        TrainConfig(mixup=True)
    with pytest.raises(TypeError, match=r"^unknown option 'dpth' for a ViT; close: depth; see"):
        TrainConfig(model_opts={"dpth": 1})
    swin = TrainConfig(model="swin_tiny_patch4_window7_224", model_opts={"depths": [1, 1, 2, 1]})
    assert swin.model_opts == {"depths": (1, 1, 2, 1)}
    with pytest.raises(TypeError, match=r"^unknown option 'window_sizes' for the Swin Trans"):
        TrainConfig(model="swin_tiny_patch4_window7_224", model_opts={"window_sizes": 4})
    config = TrainConfig(model_opts={"img_size": [8, 6]}, crop_scale=[0.5, 1])
    assert config.model_opts == {"img_size": (8, 6)} and config.crop_scale == (0.5, 1)
    with pytest.raises(TypeError, match=r"^unknown setting 'mask_ratio' .*; valid options: data,"):
        TrainConfig.from_dict({"mask_ratio": 0.5})
    with pytest.raises(TypeError, match=r"^unknown setting 'mixup'; valid options: data,"):
        PretrainConfig().replace(mixup=0.5)


def test_peak_lr_scales_the_base_rate_by_the_effective_batch():
    config = TrainConfig(blr=1e-3, batch_size=64, accum_steps=2)
    assert config.peak_lr() == pytest.approx(1e-3 * 128 / 512)
    assert config.peak_lr(world_size=4) == pytest.approx(1e-3 * 512 / 512)
    assert config.replace(lr=0.5).peak_lr(world_size=4) == 0.5


NUMERIC = [
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.metadata["range"] is not None and "float" in str(f.type)
]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(name=st.sampled_from(NUMERIC), value=st.floats(allow_nan=True, allow_infinity=True))
def test_any_number_is_taken_only_inside_its_range(name, value):
    bounds = option_fields(TrainConfig)[name].metadata["range"]
    other = {"min_lr": 0.0} if name == "lr" else {}
    try:
        config = TrainConfig(**{name: value}, **other)
    except ValueError as err:
        assert str(err).startswith(name) and "\n" not in str(err)
        assert not (math.isfinite(value) and bounds.holds(value))
    else:
        assert math.isfinite(value) and bounds.holds(getattr(config, name))


# -- settings files -----------------------------------------------------------------------------


def test_settings_round_trip_and_old_runs_lack_only_later_options(tmp_path):
    config = TrainConfig(epochs=2, crop_scale=(0.5, 1.0), model_opts={"depth": 1})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"settings": config.to_dict()}))
    assert TrainConfig.from_dict(read_settings(path, TrainConfig, complete=True)) == config
    old = {k: v for k, v in config.to_dict().items() if k not in option_names(TrainConfig, "since")}
    path.write_text(json.dumps(old))
    assert TrainConfig.from_dict(read_settings(path, TrainConfig, complete=True)) == config
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "epochs"}))
    with pytest.raises(SettingsError, match="missing setting.s. epochs; add them"):
        read_settings(path, TrainConfig, complete=True)
    assert set(option_names(TrainConfig, "runtime")) == {
        "threads", "save_every", "device", "workers", "grad_ckpt", "loggers"
    }  # fmt: skip
    assert option_names(TrainConfig, "grows") == ("epochs",)


def _legacy(settings: dict, drop_path: float) -> dict:
    """Settings as a run wrote them before the model options were flags: one config for both
    jobs, with its own drop_path, img_size and in_chans."""
    old = {k: v for k, v in settings.items() if k != "model_opts"}
    opts = {
        k: v for k, v in settings["model_opts"].items() if k not in ("drop_path_rate", "img_size")
    }
    mae = {"mask_ratio": 0.75, "decoder_dim": 128, "decoder_depth": 2, "decoder_heads": 4,
           "norm_pix": True}  # fmt: skip
    return {**old, **mae, "model_opts": opts, "drop_path": drop_path, "img_size": [8, 8],
            "in_chans": None}  # fmt: skip


def test_settings_of_a_run_before_the_model_flags_are_upgraded(tmp_path):
    path = tmp_path / "config.json"
    settings = TrainConfig(model_opts={"depth": 1, "drop_path_rate": 0.1}).to_dict()
    path.write_text(json.dumps({"settings": _legacy(settings, 0.1)}))
    upgraded = read_settings(path, TrainConfig, complete=True)
    assert upgraded["model_opts"] == {"depth": 1, "drop_path_rate": 0.1, "img_size": [8, 8]}
    assert TrainConfig.from_dict(upgraded).replace(model_opts=settings["model_opts"]) == (
        TrainConfig.from_dict(settings)
    )
    path.write_text(json.dumps({"settings": _legacy(settings, 0.0)}))  # 0: the model's own
    assert "drop_path_rate" not in read_settings(path, TrainConfig)["model_opts"]
    mae = read_settings(path, PretrainConfig, complete=True)  # the MAE run of that release
    assert mae["mask_ratio"] == 0.75 and not CLASSIFIER_ONLY & set(mae)


# -- runs: --config and --resume ----------------------------------------------------------------


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """A run with many settings away from their defaults."""
    out = tmp_path_factory.mktemp("first") / "run"
    argv = ["train", "--out", str(out), *RUN, "--mixup", "0.2", "--seed", "3", "--ema", "0.9"]
    argv += ["--clip-grad", "1.0", "--val-fraction", "0.15", "--save-every", "7"]
    assert cli.main([*argv, "--img-size", "8", "--model-opt", "drop_rate=0.1"]) == 0
    return out


def test_a_run_records_its_settings_and_model_options(first):
    recorded = settings_of(first)
    assert recorded["model_opts"] == {"drop_path_rate": 0.1, "embed_dim": 16, "depth": 1,
                                      "num_heads": 2, "img_size": 8, "drop_rate": 0.1}  # fmt: skip
    assert set(recorded) == set(option_names(TrainConfig)) - {"device"}
    assert TrainConfig.from_dict(recorded).to_dict() == {**recorded, "device": None}
    model = json.loads((first / "config.json").read_text())["model"]
    assert (model["depth"], model["drop_rate"], model["drop_path_rate"]) == (1, 0.1, 0.1)


def test_a_runs_config_reproduces_its_settings(tmp_path, capsys, first):
    code, _, _ = run(capsys, "train", "--config", first / "config.json", "--out", tmp_path / "a")
    assert code == 0
    assert settings_of(tmp_path / "a") == settings_of(first)


def test_flags_override_the_file(tmp_path, capsys, first):
    out = tmp_path / "run"
    argv = ["--config", first / "config.json", "--out", out, "--seed", "0", "--mixup", "0.8"]
    code, _, _ = run(capsys, "train", *argv, "--model-opt", "drop_rate=0.0", "--model-opt",
                     "depth=2")  # fmt: skip
    assert code == 0
    saved = settings_of(first)
    opts = {**saved["model_opts"], "drop_rate": 0.0, "depth": 2}  # key by key over the file's
    assert settings_of(out) == {**saved, "seed": 0, "mixup": 0.8, "model_opts": opts}


def test_a_flat_file_over_the_recipe(tmp_path, capsys):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"mixup": 0, "cutmix": 0.0, "clip_grad": None, "threads": 2}))
    code, _, _ = run(capsys, "train", "--config", path, "--out", tmp_path / "run", *RUN)
    assert code == 0
    got = settings_of(tmp_path / "run")
    assert (got["mixup"], got["cutmix"], got["clip_grad"], got["threads"]) == (0, 0.0, None, 2)
    assert got["epochs"] == 1 and got["model_opts"]["drop_path_rate"] == 0.1  # flag; recipe


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"epochs": "10"}', 'epochs must be an integer, got "10" (str)'),
        ('{"batch_size": true}', "batch_size must be an integer, got true (bool)"),
        ('{"epochs": 2.5}', "epochs must be an integer, got 2.5 (float)"),
        ('{"seed": null}', "seed must be an integer, got null (null)"),
        ('{"lr": "fast"}', 'lr must be a number or null, got "fast" (str)'),
        ('{"lr": -1}', "lr must be > 0, got -1"),
        ('{"compile": 1}', "compile must be true or false, got 1 (int)"),
        ('{"model_opts": ["depth=1"]}', 'model_opts must be an object, got ["depth=1"] (list)'),
        (
            '{"epoch": 3, "lrr": 0.1, "colour": 1}',
            "unknown setting(s) 'epoch' (did you mean epochs?), 'lrr' (did you mean lr, blr?), "
            "'colour'; the names are the flags' with _ for -",
        ),
        ('{"mask_ratio": 0.5}', "unknown setting(s) 'mask_ratio' (did you mean val_fraction, "),
        ('{"epochs": 3,\n "lr": }', "invalid JSON at line 2, column 8: Expecting value"),
        ("[1, 2]", "expected a JSON object of settings, got [1, 2] (list)"),
        ('{"settings": 3}', "unknown setting(s) 'settings'; the names are the flags'"),
    ],
)
def test_a_wrong_config_file_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "run.json"
    path.write_text(text)
    code, stdout, err = run(capsys, "train", "--config", path, "--out", tmp_path / "run", *RUN)
    assert (code, stdout) == (2, "")
    assert err.startswith(f"vitkit: error: --config {path}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_bad_model_option_in_a_config_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text('{"model_opts": {"img_size": [8, "8"]}}')
    code, _, err = run(capsys, "train", "--config", path, "--out", tmp_path / "run", *RUN)
    assert code == 2 and err == (
        'vitkit: error: img_size must be an integer or a list of 2 integers, got [8, "8"] (list)\n'
    )


def test_a_settings_file_takes_the_architectures_own_keys(tmp_path, capsys):
    """A --config file's model options are the --model-opt keys, checked against the model
    it names (or the command line's), typed by that schema."""
    swin = "swin_tiny_patch4_window7_224"
    path = tmp_path / "swin.json"
    path.write_text(json.dumps({"model": swin, "model_opts": {"depths": [1, 1, 1, 1],
                                                             "window_size": "4"}}))  # fmt: skip
    values = read_settings(path, TrainConfig)
    config = resolve_config({"model_opts": {"embed_dim": 32}}, values)
    assert config.model == swin
    assert config.model_opts == {"drop_path_rate": 0.1, "depths": (1, 1, 1, 1),
                                 "window_size": 4, "embed_dim": 32}  # fmt: skip
    path.write_text(json.dumps({"model_opts": {"depths": [1, 1, 1, 1]}}))
    code, _, err = run(capsys, "train", "--config", path, "--out", tmp_path / "run")
    assert code == 2 and err == (
        "vitkit: error: unknown option 'depths' for the ViT vit_digits; close: depth; see "
        "vitkit models vit_digits --options\n"
    )


def test_config_file_that_is_missing_or_combined_with_resume(tmp_path, capsys):
    path = tmp_path / "nope.json"
    code, _, err = run(capsys, "train", "--config", path, "--out", tmp_path / "run")
    assert (code, err) == (2, f"vitkit: error: --config {path}: no such file\n")
    code, _, err = run(capsys, "train", "--config", path, "--resume", "--out", tmp_path / "run")
    assert code == 2 and err.startswith(
        "vitkit: error: --config starts a new run from a settings file"
    )


def _copy_run(first: Path, out: Path, edit, names=("config.json", "state.pt")) -> None:
    out.mkdir()
    for name in names:
        (out / name).write_bytes((first / name).read_bytes())
    record = json.loads((out / "config.json").read_text())
    edited = edit(record["settings"])
    record["settings"] = edited if isinstance(edited, dict) else record["settings"]
    (out / "config.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.update(epochs="3"), 'epochs must be an integer, got "3" (str)'),
        (lambda s: s.pop("batch_size"), "missing setting(s) batch_size; add them, or start"),
        (lambda s: s.update(warmup=1), "unknown setting(s) 'warmup' (did you mean warmup_lr, "),
    ],
)
def test_a_hand_edited_config_json_on_resume(tmp_path, capsys, first, edit, message):
    out = tmp_path / "run"
    _copy_run(first, out, edit)
    code, _, err = run(capsys, "train", "--out", out, "--resume")
    assert code == 2 and err.startswith(f"vitkit: error: {out / 'config.json'}: {message}")
    (out / "config.json").write_text('{"settings": {"epochs": 3,}}')
    code, _, err = run(capsys, "train", "--out", out, "--resume")
    assert err.startswith(
        f"vitkit: error: {out / 'config.json'}: invalid JSON at line 1, column 27: "
    )


def test_an_older_runs_config_json_resumes(tmp_path, capsys, first):
    """Runs saved before --save-every existed lack it, and before the model options were
    flags they had drop_path, img_size and in_chans: they resume with the same settings."""
    names = ("config.json", "state.pt", "last.safetensors", "model.safetensors")
    out = tmp_path / "run"

    def old(settings):
        del settings["save_every"]
        return _legacy(settings, settings["model_opts"]["drop_path_rate"])

    _copy_run(first, out, old, names)
    code, stdout, _ = run(capsys, "train", "--out", out, "--resume", "--no-progress")
    assert code == 0 and stdout.splitlines()[-1].startswith("test accuracy: ")
    resumed = settings_of(out)
    assert resumed["model_opts"] == {**settings_of(first)["model_opts"], "img_size": [8, 8]}
    assert resumed["save_every"] == 0 and "drop_path" not in resumed


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    tiny = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
            "--img-size", "8", "8"]  # fmt: skip
    assert cli.main(["train", "--out", str(out), "--epochs", "1", *tiny, "--no-progress"]) == 0
    return out


def test_resume_refuses_changed_settings_and_takes_runtime_ones(finished, capsys):
    code = cli.main(["train", "--out", str(finished), "--resume", "--lr", "0.1", "--seed", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(
        f"vitkit: error: resuming {finished} continues its saved settings; it cannot change "
        "seed (saved 0, given 3), lr (saved unset, given 0.1): keep the saved values, or start "
        f"a new run from {finished / 'config.json'} with the new ones"
    )
    code = cli.main(["train", "--out", str(finished), "--resume", "--model-opt", "depth=2"])
    assert (
        code == 2
        and "it cannot change model_opts.depth (saved 1, given 2)" in capsys.readouterr().err
    )
    argv = ["train", "--out", str(finished), "--resume", "--threads", "1", "--no-progress"]
    assert cli.main([*argv, "--model-opt", "depth=1", "--model-opt", "img_size=8,8"]) == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epochs", "two"], "--epochs must be an integer, got 'two'; see `vitkit train --help`"),
        (["--amp", "fp32"], "unknown amp 'fp32'; expected one of 'none', 'bf16', 'fp16'"),
        (["--bogus"], "unknown flag --bogus; see `vitkit train --help`"),
        (
            ["--mask-ratio", "0.5"],
            "unknown flag --mask-ratio (did you mean --val-fraction?); see `vitkit train --help`",
        ),
    ],
)
def test_command_line_mistakes_are_one_line(tmp_path, capsys, argv, message):
    code = cli.main(["train", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err == f"vitkit: error: {message}\n"


def test_resume_may_raise_the_epochs_never_lower_them(tmp_path, capsys, caplog):
    """A finished 1-epoch run resumed with --epochs 2 trains one more epoch, records the new
    count in config.json and says what it took; fewer epochs than saved are refused."""
    out = tmp_path / "run"
    tiny = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]
    assert cli.main(["train", "--out", str(out), "--epochs", "2", *tiny, "--no-progress"]) == 0
    capsys.readouterr()
    code = cli.main(["train", "--out", str(out), "--resume", "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "epochs (saved 2, given 1); epochs may only grow: keep the" in err
    caplog.set_level(logging.INFO, logger="vitkit")
    resume = ["train", "--out", str(out), "--resume", "--epochs", "3", "--no-progress"]
    assert cli.main(resume) == 0
    assert "resume: taking epochs 3 (saved 2)" in caplog.messages
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert json.loads((out / "config.json").read_text())["settings"]["epochs"] == 3
    assert json.loads((out / "test.json").read_text())["best_epoch"] in (1, 2, 3)


def test_the_split_fractions_are_defined_once():
    """Every loader, the jobs' options and a checkpoint's record default to the same split
    (the folder loader once held out 0.1 for testing where the rest said 0.2)."""
    import inspect

    from vitkit.data import datasets, folders, sources
    from vitkit.weights.checkpoint import RunMeta

    defaults = {"val_fraction": datasets.VAL_FRACTION, "test_fraction": datasets.TEST_FRACTION}
    assert defaults == {"val_fraction": 0.1, "test_fraction": 0.2}
    loaders = [folders.load_image_folder, *vars(sources).values()]
    for loader in [f for f in loaders if inspect.isfunction(f)]:
        for name, parameter in inspect.signature(loader).parameters.items():
            if name in defaults and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == defaults[name], (loader.__name__, name)
    for schema in (TrainConfig, PretrainConfig, RunMeta):
        assert {n: getattr(schema(), n) for n in defaults} == defaults
