"""The model a run gets when none is named: the built-in sources' own, else one sized to a
look at the data's images (`recipes.default_choice`, `data.survey`)."""

from __future__ import annotations

import json
import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit import cli, load
from vitkit.data import SOURCES, DataError, Source
from vitkit.data.survey import survey_images
from vitkit.train import RECIPES, PretrainConfig, resolve_config
from vitkit.train.recipes import default_choice, default_model

LOGGER = "vitkit.train.recipes"
# A model small enough to train an epoch in a second, whatever the default chose.
TINY = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2",
        "--batch-size", "8"]  # fmt: skip


def _folder(root: Path, size: tuple[int, int], mode: str = "RGB", per_class: int = 3,
            classes: tuple[str, ...] = ("a", "b")) -> Path:  # fmt: skip
    """`root/<class>/<i>.png`, random images of `size` (width, height) in PIL `mode`."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).convert(mode).save(
                root / name / f"{i}.png"
            )
    return root


def _resolved(caplog, values: dict, **kwargs):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        config = resolve_config(values, **kwargs)
    return config, [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_photos_get_vit_tiny_at_224_and_the_choice_is_logged(tmp_path, caplog):
    folder = _folder(tmp_path / "my_photos", (160, 130), per_class=1)
    _folder(folder, (480, 360), classes=("c",))  # 5 images: the median is 480x360
    config, lines = _resolved(caplog, {"data": f"{folder}/"})
    assert config.model == "vit_tiny_patch16_224" and config.recipe == "deit"
    assert config.model_opts == {"drop_path_rate": 0.1, "img_size": 224, "in_chans": 3}
    assert lines == [
        f"no model given: vit_tiny_patch16_224 (img_size 224, in_chans 3) for {folder}: "
        "5 RGB images, median 480x360; set model to choose another"
    ]


def test_small_images_get_an_8x8_grid_of_patches(tmp_path, caplog):
    config, lines = _resolved(caplog, {"data": str(_folder(tmp_path / "s", (32, 32)))})
    assert config.model == "vit_tiny_patch16_224" and config.recipe == "deit"
    assert config.model_opts == {"drop_path_rate": 0.1, "img_size": 32, "patch_size": 4,
                                 "in_chans": 3}  # fmt: skip
    assert lines[0].startswith("no model given: vit_tiny_patch16_224 (img_size 32, patch_size 4")
    # the nearest multiple of 8 and its eighth: 64 tokens whatever the size between the bands
    for side, (img, patch) in {20: (24, 3), 28: (32, 4), 64: (64, 8), 127: (128, 16)}.items():
        opts = default_choice(str(_folder(tmp_path / f"s{side}", (side, side + 9)))).model_opts
        assert (opts["img_size"], opts["patch_size"]) == (img, patch), side
    assert default_choice(str(_folder(tmp_path / "p", (300, 128)))).model_opts["img_size"] == 224


@pytest.mark.parametrize(
    "modes, in_chans, colour",
    [(["L"], 1, "greyscale"), (["I;16"], 1, "greyscale"), (["LA", "1"], 1, "greyscale"),
     (["RGB"], 3, "RGB"), (["RGBA"], 3, "RGB"), (["L", "RGB"], 3, "RGB and greyscale")],
)  # fmt: skip
def test_channels_follow_the_images(tmp_path, caplog, modes, in_chans, colour):
    for i, mode in enumerate(modes):
        for name in ("a", "b"):
            (tmp_path / "d" / name).mkdir(parents=True, exist_ok=True)
            Image.new(mode, (28, 28)).save(tmp_path / "d" / name / f"{i}.png")
    config, lines = _resolved(caplog, {"data": str(tmp_path / "d")})
    assert config.model_opts["in_chans"] == in_chans
    assert f"in_chans {in_chans}) for" in lines[0]
    assert lines[0].endswith(f": {2 * len(modes)} {colour} images, median 28x28; set model to "
                             "choose another")  # fmt: skip


def test_tiny_images_keep_the_light_model_and_the_small_recipe(tmp_path, caplog):
    grey = _folder(tmp_path / "grey", (8, 8), mode="L")
    config, lines = _resolved(caplog, {"data": str(grey)})
    assert (config.model, config.recipe) == ("vit_digits", "small")
    assert config.epochs == RECIPES["small"]["epochs"]
    assert config.model_opts == {"drop_path_rate": 0.1, "img_size": 8, "in_chans": 1}
    assert lines == [
        f"no model given: vit_digits (img_size 8, in_chans 1) for {grey}: 6 greyscale images, "
        "median 8x8; set model to choose another"
    ]
    rgb = default_choice(str(_folder(tmp_path / "rgb", (15, 16))))
    assert (rgb.model, rgb.model_opts) == ("vit_digits", {"img_size": 16, "in_chans": 3})


def _cifar_archive(tmp_path: Path) -> Path:
    """A CIFAR-10 archive in the official layout, a few random images per batch."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                 b"labels": [0, 1, 0, 1]}  # fmt: skip
        (folder / name).write_bytes(pickle.dumps(batch))
    names = [b"cat", b"dog"]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}))
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


def test_a_cifar_archive_is_32x32_rgb_by_its_format(tmp_path, caplog):
    archive = _cifar_archive(tmp_path)
    for data in (str(archive), f"cifar:{archive}"):
        config, lines = _resolved(caplog, {"data": data})
        assert config.model == "vit_tiny_patch16_224" and config.recipe == "deit"
        assert config.model_opts == {"drop_path_rate": 0.1, "img_size": 32, "patch_size": 4,
                                     "in_chans": 3}  # fmt: skip
        assert lines == [
            "no model given: vit_tiny_patch16_224 (img_size 32, patch_size 4, in_chans 3) for "
            f"{archive}: CIFAR, 32x32 RGB images; set model to choose another"
        ]


@pytest.mark.parametrize("source", sorted(n for n, s in SOURCES.items() if s.model))
def test_the_built_in_sources_keep_their_presets(source, caplog):
    config, lines = _resolved(caplog, {"data": source})
    model, recipe = SOURCES[source].model, SOURCES[source].recipe
    assert (config.model, config.recipe) == (model, recipe) and lines == []
    assert config.model_opts == RECIPES[recipe].get("model_opts", {})  # no size, no channels
    assert default_model(source) == model
    assert default_model(f"{source}:/some/folder") == model


def test_a_given_model_is_never_overridden(tmp_path, caplog):
    folder = str(_folder(tmp_path / "photos", (200, 150)))
    config, lines = _resolved(caplog, {"data": folder, "model": "vit_small_patch16_224"})
    assert config.model == "vit_small_patch16_224" and lines == []
    assert config.model_opts == {"drop_path_rate": 0.1}  # the preset's size and channels
    assert config.recipe == "deit"
    # model options given stay, over the choice's; the line shows what the run takes
    config, lines = _resolved(caplog, {"data": folder, "model_opts": {"img_size": 160}})
    assert config.model_opts["img_size"] == 160 and "(img_size 160, in_chans 3)" in lines[0]
    # a settings file's model is given too
    config, lines = _resolved(caplog, {"data": folder}, file={"model": "vit_digits"})
    assert config.model == "vit_digits" and lines == []


def test_pretrained_weights_keep_their_architecture_and_are_fine_tuned(tmp_path, caplog):
    """No model is chosen for pretrained weights (theirs is the architecture; a model named
    beside them is checked against them), and the recipe is the fine-tune one, said in one
    line, unless the weights are the size of the tiny models the small recipe was measured
    with; a 224 checkpoint fine-tuned on tiny images still gets the fine-tune recipe, and a
    --recipe given is kept."""
    from vitkit import create_model, save

    folder = str(_folder(tmp_path / "photos", (12, 12)))
    weights = tmp_path / "w.safetensors"
    save(create_model("vit_tiny_patch16_224", depth=1, num_classes=2), weights)
    config, lines = _resolved(caplog, {"data": folder, "pretrained": str(weights)})
    assert config.model is None and config.recipe == "finetune"
    assert lines == [f"recipe finetune for fine-tuning {weights} (--recipe chooses another)"]
    assert (config.epochs, config.blr, config.layer_decay) == (50, 1e-3, 0.65)
    assert config.model_opts == {"drop_path_rate": 0.1}
    digits, _ = _resolved(caplog, {"data": "digits", "pretrained": str(weights)})
    assert digits.recipe == "finetune"  # not the digits' own recipe
    chosen, lines = _resolved(
        caplog, {"data": folder, "pretrained": str(weights), "recipe": "deit"}
    )
    assert chosen.recipe == "deit" and lines == []
    tiny = tmp_path / "tiny.safetensors"
    save(create_model("vit_digits", num_classes=2), tiny)
    assert resolve_config({"data": folder, "pretrained": str(tiny)}).recipe == "small"


def test_pretrain_follows_the_same_default(tmp_path, caplog):
    folder = str(_folder(tmp_path / "s", (32, 32)))
    config, _ = _resolved(caplog, {"data": folder}, job=PretrainConfig)
    assert isinstance(config, PretrainConfig) and config.model == "vit_tiny_patch16_224"
    assert config.model_opts == {"drop_path_rate": 0.1, "img_size": 32, "patch_size": 4,
                                 "in_chans": 3}  # fmt: skip


def test_the_look_is_spread_over_the_classes_and_reads_headers_only(tmp_path):
    # 150 tiny images in a, 64-px ones in b and c: the first 200 files would all but miss
    # b and c; 66 from each class see a median of 64
    root = _folder(tmp_path / "d", (8, 8), per_class=150, classes=("a",))
    _folder(root, (64, 48), per_class=150, classes=("b", "c"))
    survey = survey_images("folder", root)
    assert (survey.size, survey.count, survey.read) == ((48, 64), 450, 198)
    assert survey.describe() == "450 RGB images, median 64x48 of 198 read"
    choice = default_choice(str(root))
    assert choice.model_opts == {"img_size": 48, "patch_size": 6, "in_chans": 3}
    # a file cut after its header still tells its size: the pixels are never decoded
    cut = _folder(tmp_path / "cut", (300, 200))
    for png in cut.rglob("*.png"):
        png.write_bytes(png.read_bytes()[:100])
    with pytest.raises(OSError), Image.open(next(cut.rglob("*.png"))) as img:
        img.load()
    assert survey_images("folder", cut).size == (200, 300)


def _turned_jpegs(folder: Path, n: int = 3) -> None:
    """JPEGs stored 200x130 whose EXIF says to turn them a quarter: seen 130 wide, 200 high."""
    folder.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    for i in range(n):
        Image.new("RGB", (200, 130)).save(folder / f"t{i}.jpg", exif=exif)


def test_the_look_reads_the_train_folder_as_the_loader_sees_it(tmp_path):
    _folder(tmp_path / "d" / "train", (40, 40))
    _folder(tmp_path / "d" / "val", (300, 300), per_class=9)  # not what the model is sized for
    assert survey_images("folder", tmp_path / "d").count == 6
    _turned_jpegs(tmp_path / "e" / "a")
    _turned_jpegs(tmp_path / "e" / "b")
    assert survey_images("folder", tmp_path / "e").size == (200, 130)


def test_data_with_nothing_to_go_by_keeps_the_old_default(tmp_path, monkeypatch, caplog):
    for name in ("a", "b"):  # no image opens: the loader names the files, not the look
        (tmp_path / "d" / name).mkdir(parents=True)
        (tmp_path / "d" / name / "x.png").write_bytes(b"not an image")
    assert survey_images("folder", tmp_path / "d") is None
    (tmp_path / "d" / "a" / "y.png").write_bytes(b"not either")
    Image.new("RGB", (20, 20)).save(tmp_path / "d" / "b" / "y.png")
    assert survey_images("folder", tmp_path / "d").describe() == (
        "1 RGB image, median 20x20"  # the 3 unreadable are left out, as the loader leaves them
    )
    # in memory, with no facts of its own: not looked at
    monkeypatch.setitem(SOURCES, "mine", Source("mine", SOURCES["digits"].load))
    config, lines = _resolved(caplog, {"data": "mine"})
    assert (config.model, config.recipe) == ("vit_digits", "small")
    assert lines == [
        "no model given: vit_digits for mine: nothing of its images to go by; set model to "
        "choose another"
    ]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no class sub-folders"):  # the loader's own error
        default_choice(str(tmp_path / "empty"))


def test_train_on_a_folder_of_tiny_images_names_the_model(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)
    _folder(tmp_path / "tiny", (8, 8), per_class=6)
    caplog.set_level(logging.INFO, logger="vitkit")
    argv = ["train", "--data", "tiny", "--epochs", "1", "--no-progress", *TINY]
    assert cli.main(argv) == 0
    line = ("no model given: vit_digits (img_size 8, in_chans 3) for tiny: 12 RGB images, "
            "median 8x8; set model to choose another")  # fmt: skip
    assert line in caplog.messages
    run = tmp_path / "runs" / "tiny-vit_digits"
    settings = json.loads((run / "config.json").read_text())["settings"]
    assert (settings["model"], settings["recipe"]) == ("vit_digits", "small")
    assert settings["model_opts"]["img_size"] == 8 and settings["model_opts"]["in_chans"] == 3
    model = load(run / "model.safetensors")
    assert model.config.in_chans == 3 and model.patch_embed.img_size == (8, 8)
    assert capsys.readouterr().out.splitlines()[-1].startswith("test accuracy: ")


def test_resume_of_a_default_model_run_finds_its_folder(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)
    _folder(tmp_path / "small", (32, 32), per_class=6)
    start = ["train", "--data", "small", "--no-progress", *TINY]
    assert cli.main([*start, "--epochs", "1"]) == 0
    run = tmp_path / "runs" / "small-vit_tiny_patch16_224"
    assert (run / "state.pt").is_file()
    caplog.set_level(logging.INFO, logger="vitkit")
    assert cli.main(["train", "--data", "small", "--epochs", "2", "--resume",
                     "--no-progress"]) == 0  # fmt: skip
    assert "resume: taking epochs 2 (saved 1)" in caplog.messages
    assert not any(m.startswith("no model given") for m in caplog.messages)  # saved, not chosen
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1, 2]
    model = load(run / "model.safetensors")
    assert model.patch_embed.img_size == (32, 32) and model.patch_embed.patch_size == (4, 4)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run.name]
