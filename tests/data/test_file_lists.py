"""File lists (`--data list:train.csv`): CSV and JSONL lists of tiny PNGs made here, their class
map, ready-made val / test lists or the seeded split, the careless inputs each refused in one
line naming the line, and a list source that trains and resumes bit for bit after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from _helpers import killing_driver, run_driver
from vitkit.data import DataError, collate, detect_source, load_data, split_indices
from vitkit.train import ClassificationTask, resolve_config, run_job

SRC = Path(__file__).resolve().parents[2] / "src"
CLASSES = ("cat", "dog", "fox")


def write_images(folder: Path, labels: list[str], *, size: int = 8) -> list[str]:
    """One PNG per label in folder/img/, brighter for later classes; their relative paths."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i, label in enumerate(labels):
        level = 80 * CLASSES.index(label.split(";")[0])
        pixels = (rng.random((size, size, 3)) * 60 + level).astype(np.uint8)
        Image.fromarray(pixels).save(folder / "img" / f"{i}.png")
        paths.append(f"img/{i}.png")
    return paths


def write_csv(path: Path, paths: list[str], labels: list[str], header: str = "path,label") -> Path:
    rows = [header, *(f"{p},{label}" for p, label in zip(paths, labels))]
    path.write_text("\n".join(rows) + "\n")
    return path


def write_jsonl(path: Path, paths: list[str], labels: list) -> Path:
    path.write_text(
        "".join(json.dumps({"path": p, "label": lb}) + "\n" for p, lb in zip(paths, labels))
    )
    return path


def labels_of(n: int) -> list[str]:
    return [CLASSES[i % 3] for i in range(n)]


def test_a_csv_list_loads_with_sorted_labels_and_the_folder_split(tmp_path):
    labels = labels_of(30)
    paths = write_images(tmp_path, labels)
    splits = load_data(f"list:{write_csv(tmp_path / 'all.csv', paths, labels)}", in_chans=1)
    assert splits.class_names == ["cat", "dog", "fox"]
    assert splits.extra == {"multi_label": False}
    index = [CLASSES.index(label) for label in labels]
    train, val, test = split_indices(30, (0.1, 0.2), 0, index)  # the folders' seeded split
    expected = [(str(tmp_path / paths[i]), index[i]) for i in train]
    assert splits.train.samples == expected
    assert [len(splits.val), len(splits.test)] == [len(val), len(test)] == [3, 6]
    image, label = splits.train[0]
    assert image.shape == (1, 8, 8) and label == index[train[0]]


def test_a_jsonl_list_and_a_file_column_read_as_the_csv(tmp_path):
    labels = labels_of(12)
    paths = write_images(tmp_path, labels)
    csv_splits = load_data(str(write_csv(tmp_path / "a.csv", paths, labels, "file,label")))
    jsonl_splits = load_data(str(write_jsonl(tmp_path / "a.jsonl", paths, labels)))
    assert detect_source(str(tmp_path / "a.jsonl")) == ("list", str(tmp_path / "a.jsonl"))
    for part in ("train", "val", "test"):
        assert getattr(csv_splits, part).samples == getattr(jsonl_splits, part).samples


def test_the_class_map_orders_the_classes(tmp_path):
    labels = labels_of(12)
    paths = write_images(tmp_path, labels)
    (tmp_path / "classes.txt").write_text("fox\ncat\ndog\nwolf\n")
    splits = load_data(f"list:{write_csv(tmp_path / 'train.csv', paths, labels)}")
    assert splits.class_names == ["fox", "cat", "dog", "wolf"]
    mapped = {Path(p).name: label for p, label in splits.train.samples}
    assert all(mapped[Path(p).name] == ["fox", "cat", "dog"].index(lb)
               for p, lb in zip(paths, labels) if Path(p).name in mapped)  # fmt: skip


def test_val_and_test_lists_beside_train_are_the_splits(tmp_path):
    labels = labels_of(18)
    paths = write_images(tmp_path, labels)
    write_csv(tmp_path / "train.csv", paths[:12], labels[:12])
    write_csv(tmp_path / "val.csv", paths[12:15], labels[12:15])
    write_csv(tmp_path / "test.csv", paths[15:], labels[15:])
    splits = load_data(f"list:{tmp_path / 'train.csv'}")
    assert [len(splits.train), len(splits.val), len(splits.test)] == [12, 3, 3]
    assert [Path(p).name for p, _ in splits.test.samples] == ["15.png", "16.png", "17.png"]


def test_several_labels_make_a_multi_label_list(tmp_path):
    labels = ["cat;dog", "dog", "fox;cat", "fox"] * 3
    paths = write_images(tmp_path, labels)
    splits = load_data(str(write_csv(tmp_path / "l.csv", paths, labels)), test_fraction=0.0)
    assert splits.extra == {"multi_label": True}
    dataset = splits.train
    targets = {Path(dataset.samples[i][0]).name: dataset[i][1] for i in range(len(dataset))}
    assert torch.equal(targets["0.png"], torch.tensor([1.0, 1.0, 0.0]))
    assert torch.equal(targets["3.png"], torch.tensor([0.0, 0.0, 1.0]))
    images, stacked = collate([dataset[0], dataset[1]])
    assert (
        images.shape == (2, 3, 8, 8) and stacked.shape == (2, 3) and stacked.dtype == torch.float32
    )
    jsonl = write_jsonl(tmp_path / "l.jsonl", paths, [label.split(";") for label in labels])
    assert load_data(str(jsonl), test_fraction=0.0).train.samples == dataset.samples


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "l.csv line 3: image img/gone.png not found (looked for"),
        ("empty", "l.csv lists no images; add one line per image"),
        ("header", "header 'image,class' lacks a path (or file) and a label column; the first "
                   "line must be path,label"),
        ("unknown", "l.csv line 4: label 'fox' is not in"),
        ("jsonl", "l.jsonl line 2: expected an object with \"path\" and \"label\""),
        ("suffix", "unknown format .txt; write a .csv"),
        ("no-name", "list: name the file list, e.g. --data list:train.csv"),
        ("empty-file", "l.csv is empty; its first line must be the header path,label"),
        ("folder", "l.csv is a folder, not a file; name a .csv or .jsonl file (class folders "
                   "of images are --data "),
        ("fifo", "l.csv is a FIFO (named pipe), not a regular file; name a .csv or .jsonl file"),
        ("latin-1", "l.csv line 2: byte 0xe9 is not UTF-8 text; save the list as UTF-8"),
        ("repeated", "l.csv line 4: image ./img/0.png is listed again (first on line 2); list "
                     "each image once, with all its labels (;-separated)"),
        ("blank-label", "l.csv line 3: no label; give one (or several separated by ;)"),
        ("separators", "l.csv line 3: no label; give one (or several separated by ;)"),
        ("null", "l.jsonl line 2: no label; give one (or several separated by ;)"),
        ("fraction", "l.jsonl line 2: label 1.5 is not a class name; give a string, a whole "
                     "number, or a list of them"),
        ("object", 'l.jsonl line 2: label {"a": 1} is not a class name; give a string'),
    ],
)  # fmt: skip
def test_careless_lists_are_refused_in_one_line(tmp_path, case, message):
    labels = labels_of(3)
    paths = write_images(tmp_path, labels)
    spec = f"list:{tmp_path / 'l.csv'}"
    if case == "missing":
        write_csv(tmp_path / "l.csv", [paths[0], "img/gone.png", paths[2]], labels)
    elif case == "empty":
        (tmp_path / "l.csv").write_text("path,label\n")
    elif case == "header":
        write_csv(tmp_path / "l.csv", paths, labels, header="image,class")
    elif case == "unknown":
        (tmp_path / "classes.txt").write_text("cat\ndog\n")
        write_csv(tmp_path / "l.csv", paths, labels)
    elif case == "jsonl":
        (tmp_path / "l.jsonl").write_text(
            json.dumps({"path": paths[0], "label": "cat"}) + "\n[1]\n"
        )
        spec = f"list:{tmp_path / 'l.jsonl'}"
    elif case == "suffix":
        (tmp_path / "l.txt").write_text("x")
        spec = f"list:{tmp_path / 'l.txt'}"
    elif case == "no-name":
        spec = "list:"  # not the working folder
    elif case == "empty-file":
        (tmp_path / "l.csv").write_text("")
    elif case == "folder":
        (tmp_path / "l.csv").mkdir()
    elif case == "fifo":
        os.mkfifo(tmp_path / "l.csv")  # never opened: that would block
    elif case == "latin-1":
        (tmp_path / "l.csv").write_bytes(f"path,label\n{paths[0]},caf\xe9\n".encode("latin-1"))
    elif case == "repeated":
        write_csv(tmp_path / "l.csv", [paths[0], paths[1], f"./{paths[0]}"], labels)
    elif case in ("blank-label", "separators"):
        write_csv(tmp_path / "l.csv", paths, [labels[0], "  " if case == "blank-label" else ";"])
    else:  # a JSON label that names no class
        label = {"null": None, "fraction": 1.5, "object": {"a": 1}}[case]
        write_jsonl(tmp_path / "l.jsonl", paths[:2], ["cat", label])
        spec = f"list:{tmp_path / 'l.jsonl'}"
    with pytest.raises(DataError) as caught:
        load_data(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_byte_order_mark_and_crlf_line_ends_read_as_plain_utf8(tmp_path):
    labels = labels_of(12)
    paths = write_images(tmp_path, labels)
    plain = write_csv(tmp_path / "plain.csv", paths, labels)
    excel = tmp_path / "excel.csv"  # Excel's "CSV UTF-8": a BOM and CRLF
    excel.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    jsonl = write_jsonl(tmp_path / "plain.jsonl", paths, labels)
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl.read_bytes().replace(b"\n", b"\r\n"))
    expected = load_data(str(plain)).train.samples
    assert load_data(str(excel)).train.samples == expected
    assert load_data(str(bom_jsonl)).train.samples == expected


# 2 batches of 16 an epoch (38 images: 27 train), 3 epochs, a tiny model at 8x8
FLAGS = (
    "--model", "vit_digits", "--epochs", "3", "--batch-size", "16", "--lr", "5e-3",
    "--warmup-epochs", "0.5", "--model-opt", "embed_dim=16", "--model-opt", "depth=1",
    "--model-opt", "num_heads=2", "--no-progress",
)  # fmt: skip


def make_list(folder: Path, n: int = 38, *, multi: bool = False) -> Path:
    """A list of `n` images of the three classes; `multi`: every third image also 'fox'."""
    labels = labels_of(n)
    if multi:
        labels = [f"{label};fox" if i % 3 == 1 else label for i, label in enumerate(labels)]
    return write_csv(folder / "train.csv", write_images(folder, labels), labels)


def test_a_list_trains_and_evaluates(tmp_path):
    data = make_list(tmp_path / "data")
    options = {"data": f"list:{data}", "model": "vit_digits", "epochs": 2, "batch_size": 16,
               "lr": 5e-3, "model_opts": {"embed_dim": 16, "depth": 1, "num_heads": 2}}  # fmt: skip
    outcome = run_job(ClassificationTask, resolve_config(options), tmp_path / "run")
    assert [row["epoch"] for row in outcome.result.history] == [1, 2]
    assert outcome.test["count"] == 8  # the seeded test split: round(0.2 * 38 / 3) per class
    saved = json.loads((tmp_path / "run" / "test.json").read_text())
    assert saved["test_acc1"] == outcome.test["acc1"]


def test_eval_scores_the_test_list_beside_train(tmp_path, capsys):
    from vitkit.cli import main

    labels = labels_of(24)
    paths = write_images(tmp_path, labels)
    write_csv(tmp_path / "train.csv", paths[:15], labels[:15])
    write_csv(tmp_path / "val.csv", paths[15:18], labels[15:18])
    write_csv(tmp_path / "test.csv", paths[18:], labels[18:])
    argv = ["--data", f"list:{tmp_path / 'train.csv'}", *FLAGS[:2], "--epochs", "1", *FLAGS[4:]]
    assert main(["train", *argv, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    checkpoint = tmp_path / "run" / "model.safetensors"
    assert main(["eval", "--checkpoint", str(checkpoint), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["count"], row["part"]) == (6, "test split")  # test.csv's six images
    assert [c["support"] for c in row["per_class"]] == [2, 2, 2]
    # another list is scored whole, labelled by the model's classes
    write_csv(tmp_path / "heldout.csv", paths[15:], labels[15:])
    assert main(["eval", "--checkpoint", str(checkpoint), "--json",
                 "--data", str(tmp_path / "heldout.csv")]) == 0  # fmt: skip
    row = json.loads(capsys.readouterr().out)
    assert (row["count"], row["part"]) == (9, "all")
    write_csv(tmp_path / "odd.csv", paths[:2], ["cat", "wolf"])
    assert main(["eval", "--checkpoint", str(checkpoint), "--data", str(tmp_path / "odd.csv")]) == 2
    assert "odd.csv line 3: label 'wolf' is not in the model's classes" in capsys.readouterr().err


@pytest.mark.slow  # three processes, about 45 s on 2 busy cores
@pytest.mark.parametrize("multi", [False, True], ids=["single-label", "multi-label"])
def test_sigkill_in_the_middle_of_an_epoch_then_resume_is_bit_identical(tmp_path, multi):
    data = make_list(tmp_path / "data", multi=multi)
    driver = killing_driver(tmp_path / "driver.py")
    flags = ("--data", f"list:{data}", *FLAGS, "--crop-scale", "0.5", "1.0")
    whole = run_driver(driver, "train", *flags, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut = tmp_path / "cut"
    # writes: before the first epoch, step 1, step 2, the end of epoch 1, step 3, ...: the
    # fifth (epoch 2, batch 1 of 2) is in place when the sixth is killed
    killed = run_driver(driver, "train", *flags, "--out", str(cut), "--save-every", "1", kill_at=6)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(cut / "state.pt", weights_only=True)
    assert (saved["epoch"], saved["epoch_state"]["batches"]) == (1, 1)
    resumed = run_driver(driver, "train", "--out", str(cut), "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at epoch 2, batch 2" in resumed.stderr
    assert ("val_map" in resumed.stderr) == multi
    for name in ("model.safetensors", "last.safetensors"):
        ours, theirs = load_file(cut / name), load_file(tmp_path / "whole" / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    reference = (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    assert [row["train_loss"] for row in rows] == [json.loads(r)["train_loss"] for r in reference]


def test_the_default_model_is_sized_to_the_listed_images(tmp_path):
    from vitkit.train.recipes import default_choice

    labels = labels_of(6)
    data = write_csv(tmp_path / "l.csv", write_images(tmp_path, labels, size=12), labels)
    choice = default_choice(f"list:{data}")
    assert (choice.model, choice.model_opts) == ("vit_digits", {"img_size": 12, "in_chans": 3})
    assert choice.seen == "6 RGB images, median 12x12"
