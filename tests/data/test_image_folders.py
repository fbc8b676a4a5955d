"""Image folders as people lay them out: `valid/` and `validation/` beside `train/`, the layout
logged, strange sub-folders named; what `eval` scores; the files `predict` takes; unreadable
files skipped and named, and a folder of nothing but unreadable files reported by name."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import ConcatDataset

from vitkit.data import (
    DataError,
    Subset,
    Transformed,
    eval_transform,
    evaluation_set,
    find_images,
    folder_layout,
    load_data,
    load_images,
    open_image,
    unreadable_files,
)
from vitkit.data.data_config import DataConfig


def _classes(root: Path, counts: dict[str, int], size: int = 6) -> Path:
    for label, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.new("RGB", (size, size), (40 * label + i, 0, 0)).save(root / name / f"{i}.png")
    return root


def _messages(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


@pytest.mark.parametrize("val_name", ["val", "valid", "validation"])
def test_every_common_name_of_the_validation_folder_is_read(tmp_path, caplog, val_name):
    root = tmp_path / "pets"
    _classes(root / "train", {"cat": 6, "dog": 6})
    _classes(root / val_name, {"cat": 2, "dog": 1})
    caplog.set_level(logging.INFO, logger="vitkit.data")
    splits = load_data(str(root), val_fraction=0.5, test_fraction=0.25, seed=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 3, 4)
    assert sorted(Path(p).parent.parent.name for p, _ in splits.val.samples) == [val_name] * 3
    assert _messages(caplog) == [
        f"data folder {root}: train train/ (8 images), val {val_name}/ (3 images), test cut "
        "from train/ (4 images); 2 classes; split seed 3"
    ]
    assert _messages(caplog, logging.WARNING) == []


def test_the_layout_of_a_fully_split_and_of_a_plain_folder_is_logged(tmp_path, caplog):
    root = tmp_path / "pets"
    for part, n in (("train", 4), ("validation", 2), ("test", 1)):
        _classes(root / part, {"cat": n, "dog": n})
    caplog.set_level(logging.INFO, logger="vitkit.data")
    load_data(str(root))
    plain = _classes(tmp_path / "plain", {"cat": 10, "dog": 10})
    load_data(str(plain), val_fraction=0.1, test_fraction=0.2)
    assert _messages(caplog) == [
        f"data folder {root}: train train/ (8 images), val validation/ (4 images), test test/ "
        "(2 images); 2 classes",
        f"data folder {plain}: train cut from the class folders (14 images), val cut from the "
        "class folders (2 images), test cut from the class folders (4 images); 2 classes; "
        "split seed 0",
    ]


def test_unexpected_sub_folders_are_named_in_a_warning(tmp_path, caplog):
    root = tmp_path / "pets"
    _classes(root / "train", {"cat": 4, "dog": 4})
    _classes(root / "dev", {"cat": 2, "dog": 2})
    (root / "extra").mkdir()
    (root / ".cache").mkdir()  # hidden: not a split, not mentioned
    caplog.set_level(logging.INFO, logger="vitkit.data")
    splits = load_data(str(root), val_fraction=0.25, test_fraction=0.25)
    assert len(splits.train) + len(splits.val) + len(splits.test) == 8  # dev/ is not read
    assert _messages(caplog, logging.WARNING) == [
        f"data folder {root}: ignoring dev/, extra/ beside train/ (vitkit reads train/, val/ or "
        "valid/ or validation/, and test/); rename a folder that holds one of those splits"
    ]
    assert folder_layout(root).ignored == ("dev", "extra")


def test_two_names_for_one_split_and_a_split_folder_without_train_are_refused(tmp_path):
    root = tmp_path / "pets"
    for part in ("train", "val", "valid"):
        _classes(root / part, {"cat": 2, "dog": 2})
    with pytest.raises(DataError) as err:
        load_data(str(root))
    assert str(err.value) == (
        f"data folder {root} has val/ and valid/, all names of the val split; keep one of them"
    )
    held = tmp_path / "held"
    _classes(held / "test", {"cat": 2, "dog": 2})
    with pytest.raises(DataError, match=r"has test/ but no train/; training reads .*/train/<cl"):
        load_data(str(held))


# -- a data set of nothing but unreadable files ---------------------------------------------


def _broken(root: Path, counts: dict[str, int]) -> list[Path]:
    paths = []
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            paths.append(root / name / f"{i}.png")
            paths[-1].write_bytes(b"not a png " * i)
    return paths


def test_a_folder_whose_every_image_is_unreadable_names_them(tmp_path):
    root = tmp_path / "pets"
    broken = _broken(root, {"cat": 3, "dog": 3})
    with pytest.raises(DataError) as err:  # found by the survey, before any is decoded
        load_data(str(root), val_fraction=0.0, test_fraction=0.0)
    first = sorted(map(str, broken))[:3]
    assert str(err.value).startswith(
        f"cannot read any of the 6 images: {first[0]} (cannot identify image file"
    )
    assert all(path in str(err.value) for path in first)
    assert "; and 3 more; check that these are image files" in str(err.value)


def test_training_on_a_folder_of_unreadable_images_names_them(tmp_path, capsys):
    from vitkit import cli

    root = tmp_path / "pets"
    _broken(root, {"cat": 4, "dog": 4})
    argv = ["train", "--data", str(root), "--out", str(tmp_path / "run"), "--epochs", "1",
            "--img-size", "8", "--no-progress", "--model-opt", "depth=1"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit: error: cannot read any of the ") and "; and " in err
    assert "the evaluation data is empty" not in err and err.count("\n") == 1


# -- what eval scores -----------------------------------------------------------------------


def test_eval_scores_a_folders_held_out_part_or_all_of_it(tmp_path):
    split = tmp_path / "split"
    _classes(split / "train", {"cat": 5, "dog": 5, "eel": 5})
    _classes(split / "valid", {"cat": 2, "dog": 2})  # eel missing: labels follow train/
    chosen = evaluation_set(str(split))
    assert (chosen.part, chosen.class_names) == ("val", ["cat", "dog", "eel"])
    assert chosen.description == f"{split / 'valid'}/ (4 images)"
    assert sorted(chosen.dataset[i][1] for i in range(4)) == [0, 0, 1, 1]
    _classes(split / "test", {"eel": 3})
    chosen = evaluation_set(str(split))
    assert (chosen.part, len(chosen.dataset), chosen.dataset[0][1]) == ("test", 3, 2)
    flat = _classes(tmp_path / "heldout", {"cat": 7, "dog": 3})
    chosen = evaluation_set(str(flat), trained_on="digits")
    assert (chosen.part, len(chosen.dataset)) == ("all", 10)
    assert chosen.description == f"all of {flat}/ (10 images)"


def test_eval_of_the_training_folder_scores_the_split_training_never_saw(tmp_path, monkeypatch):
    flat = _classes(tmp_path / "pets", {"cat": 10, "dog": 10})
    monkeypatch.chdir(tmp_path)
    chosen = evaluation_set("pets/", trained_on=str(flat), test_fraction=0.2, seed=4)
    trained = load_data(str(flat), test_fraction=0.2, seed=4)
    assert chosen.part == "test split" and len(chosen.dataset) == 4
    resolved = [(Path(path).resolve(), label) for path, label in chosen.dataset.samples]
    assert resolved == [(Path(path), label) for path, label in trained.test.samples]
    assert chosen.description.startswith("the test split of pets/ (4 images, split seed 4")
    digits = evaluation_set("digits", trained_on="digits")
    assert (digits.part, len(digits.dataset)) == ("test split", 359)


def test_eval_labels_a_folder_by_the_models_classes(tmp_path):
    flat = _classes(tmp_path / "heldout", {"dog": 2, "cat": 1})
    chosen = evaluation_set(str(flat), class_names=["bird", "cat", "dog"])
    assert chosen.class_names == ["bird", "cat", "dog"]
    assert sorted(chosen.dataset[i][1] for i in range(3)) == [1, 2, 2]
    with pytest.raises(DataError, match=r"has classes not in the model's classes: dog"):
        evaluation_set(str(flat), class_names=["bird", "cat"])


def test_eval_skips_and_names_unreadable_files(tmp_path):
    flat = _classes(tmp_path / "heldout", {"cat": 3, "dog": 3})
    (flat / "dog" / "bad.png").write_bytes(b"garbage")
    chosen = evaluation_set(str(flat))
    config = DataConfig(input_size=(3, 4, 4), mean=0.5, std=0.5)
    everything = ConcatDataset(
        [Transformed(Subset(chosen.dataset, range(7)), eval_transform(config))]
    )
    items = [everything[i] for i in range(len(everything))]
    assert sum(item is None for item in items) == 1
    (reason,) = unreadable_files(everything).values()
    assert list(unreadable_files(everything)) == [str(flat / "dog" / "bad.png")]
    assert reason.startswith("cannot identify image file")


# -- what predict takes ---------------------------------------------------------------------


def test_files_folders_and_patterns_become_image_paths(tmp_path, monkeypatch):
    root = _classes(tmp_path / "photos", {"a": 2, "b/deep": 1})
    (root / "a" / "notes.txt").write_text("not an image")
    (root / "a" / "UPPER.JPG").write_bytes(b"")  # the extension counts, in any case
    (root / ".thumbs").mkdir()
    Image.new("RGB", (2, 2)).save(root / ".thumbs" / "0.png")  # hidden: skipped
    named = tmp_path / "named.data"
    named.write_bytes(b"")  # named outright: taken, decoding judges it
    monkeypatch.chdir(tmp_path)
    found = find_images([str(named), "photos", "photos/**/0.png", "photos/a/*"])
    assert found == [
        named,
        Path("photos/a/0.png"),
        Path("photos/a/1.png"),
        Path("photos/a/UPPER.JPG"),
        Path("photos/b/deep/0.png"),
    ]
    (tmp_path / "empty").mkdir()
    for inputs, message in [
        (["nope.png"], "image nope.png does not exist"),
        (["empty"], "folder empty holds no images (searched recursively for .png, .jpg, "),
        (["photos/*.gif"], "photos/*.gif matches no image file"),
        ([], "no images given; name image files, folders or patterns such as *.jpg"),
    ]:
        with pytest.raises(DataError) as err:
            find_images(inputs)
        assert str(err.value).startswith(message)


def test_one_bad_image_does_not_stop_the_others(tmp_path, caplog):
    good = [_classes(tmp_path, {"x": 2}, size=9) / "x" / f"{i}.png" for i in range(2)]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    config = DataConfig(input_size=(3, 4, 4), mean=0.5, std=0.5, crop_pct=0.8)
    transform = eval_transform(config)
    paths = [good[0], bad, tmp_path / "gone.png", good[1]]
    loaded = load_images(paths, transform, in_chans=3)
    assert loaded.paths == [str(good[0]), str(good[1])]
    expected = torch.stack([transform(open_image(p)) for p in good])
    assert torch.equal(loaded.images, expected)
    assert list(loaded.skipped) == [str(bad), str(tmp_path / "gone.png")]
    assert loaded.skipped[str(tmp_path / "gone.png")] == "it does not exist"
    assert loaded.skipped[str(bad)] == "cannot identify image file"  # the path named once
    assert _messages(caplog, logging.WARNING) == []  # the caller reports them, in one line
    nothing = load_images([bad], transform)
    assert (
        nothing.images.shape == (0,) and nothing.paths == [] and list(nothing.skipped) == [str(bad)]
    )
