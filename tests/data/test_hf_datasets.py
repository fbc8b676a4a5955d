"""Hugging Face datasets on disk (`hfds:` map-style, `hfids:` streamed): saved datasets,
Parquet, the imagefolder and csv builders; columns found or named, class names from the
ClassLabel, images decoded as `datasets` decodes them, splits per rank, unreadable images
counted, and one line for a dataset that is not on disk or a missing extra."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.cli.errors import describe
from vitkit.data import load_data, unreadable_files
from vitkit.data.images import DataError

pytestmark = pytest.mark.requires("datasets", extra="datasets")


def png(value: int, seed: int) -> bytes:
    """A 6x5 RGB PNG of seeded noise around `value`."""
    pixels = np.random.default_rng(seed).integers(0, 100, (6, 5, 3)) + value
    data = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(data, format="PNG")
    return data.getvalue()


def table(count: int = 40, broken: tuple[int, ...] = ()):
    """`count` rows: an Image column `img` (dark / light by label) and a ClassLabel `label`."""
    import datasets

    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["dark", "light"])}
    )
    images = [b"broken" if i in broken else png(120 * (i % 2), i) for i in range(count)]
    rows = {
        "img": [{"bytes": b, "path": None} for b in images],
        "label": [i % 2 for i in range(count)],
    }
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture
def saved(tmp_path):
    """A DatasetDict with train (30) and test (10) saved with save_to_disk."""
    import datasets

    whole = table()
    parts = {"train": whole.select(range(30)), "test": whole.select(range(30, 40))}
    datasets.DatasetDict(parts).save_to_disk(tmp_path / "saved")
    return tmp_path / "saved"


def test_a_saved_dataset_gives_its_splits_and_class_names(saved):
    import datasets

    splits = load_data(f"hfds:{saved}", seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (26, 4, 10)  # val cut
    assert splits.class_names == ["dark", "light"]
    theirs = datasets.load_from_disk(str(saved))["test"]
    for index in (0, 7):
        image, label = splits.test[index]
        assert label == theirs[index]["label"]
        assert np.array_equal(np.asarray(image), np.asarray(theirs[index]["img"].convert("RGB")))
    labels = [splits.val[i][1] for i in range(len(splits.val))]
    assert sorted(labels) == [0, 0, 1, 1]  # stratified by label


def test_parquet_files_and_a_stream_of_them_hold_the_same_samples(tmp_path):
    table().to_parquet(tmp_path / "data.parquet")
    mapped = load_data(f"hfds:{tmp_path / 'data.parquet'}", seed=1)
    streamed = load_data(f"hfids:{tmp_path / 'data.parquet'}", seed=1)
    for part in ("train", "val", "test"):
        ours = [getattr(mapped, part)[i] for i in range(len(getattr(mapped, part)))]
        theirs = list(getattr(streamed, part))
        assert len(getattr(streamed, part)) == len(ours) == len(theirs)
        assert [(np.asarray(a).tobytes(), b) for a, b in ours] == [
            (np.asarray(a).tobytes(), b) for a, b in theirs
        ], part
    assert (len(mapped.train), len(mapped.val), len(mapped.test)) == (28, 4, 8)
    assert load_data(f"hfds:{tmp_path}").class_names == ["dark", "light"]  # a folder of them


def test_a_stream_is_split_between_ranks(saved):
    stream = load_data(f"hfids:{saved}", val_fraction=0, test_fraction=0).test  # 10 rows
    parts = [[where for where, _ in stream.part(rank, 2)] for rank in range(2)]
    rows = [[row["img"]["bytes"] for _, row in stream.part(rank, 2)] for rank in range(2)]
    assert len(rows[0]) + len(rows[1]) == 10 and not set(rows[0]) & set(rows[1])
    assert parts[0][0].endswith("test part 0") and parts[1][0].endswith("test part 1")
    cut = load_data(f"hfids:{saved}", seed=0).train  # 26 of 30: every other of the kept
    halves = [[where for where, _ in cut.part(rank, 2)] for rank in range(2)]
    assert [len(h) for h in halves] == [13, 13] and not set(halves[0]) & set(halves[1])


def test_the_imagefolder_and_csv_builders_read_local_files(tmp_path):
    for label, name in enumerate(("cat", "dog")):
        (tmp_path / "pets" / name).mkdir(parents=True)
        for i in range(5):
            (tmp_path / "pets" / name / f"{i}.png").write_bytes(png(120 * label, i))
    splits = load_data(f"hfds:imagefolder:{tmp_path / 'pets'}", val_fraction=0.2, test_fraction=0.2)
    assert splits.class_names == ["cat", "dog"]
    assert (len(splits.train), len(splits.val), len(splits.test)) == (6, 2, 2)
    lines = ["file,kind"] + [f"pets/{n}/{i}.png,{n}" for n in ("dog", "cat") for i in range(5)]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="no column with an Image feature; name its image column"):
        load_data(f"hfds:csv:{tmp_path / 'list.csv'}")
    splits = load_data(
        f"hfds:csv:{tmp_path / 'list.csv'}", image_column="file", label_column="kind",
        val_fraction=0.2, test_fraction=0.2,
    )  # fmt: skip
    assert splits.class_names == ["cat", "dog"]  # strings, numbered in sorted order
    image, label = splits.train[0]
    source = Image.open(io.BytesIO(png(120 * label, 0)))  # a path relative to the csv
    assert image.size == source.size == (5, 6)


def test_an_unreadable_image_is_skipped_and_named(tmp_path):
    table(broken=(3,)).to_parquet(tmp_path / "d.parquet")
    splits = load_data(f"hfds:{tmp_path / 'd.parquet'}", val_fraction=0, test_fraction=0)
    items = [splits.train[i] for i in range(len(splits.train))]
    assert sum(item is None for item in items) == 1
    assert unreadable_files(splits.train) == {
        f"{tmp_path / 'd.parquet'}:train[3]": "cannot identify image file"
    }


def test_a_dataset_not_on_disk_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "hfds:cifar10", "--model", "vit_digits", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "vitkit: error: no dataset on disk at cifar10; vitkit downloads nothing at run time: "
        "save it once with python -c \"import datasets; datasets.load_dataset('cifar10')"
        ".save_to_disk('cifar10')\" and pass --data hfds:cifar10"
    )


def _labelled(labels: list) -> Any:
    """Four images with a plain (not ClassLabel) `label` column of these values."""
    import datasets

    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("float64")})
    if all(isinstance(v, int) for v in labels):
        features["label"] = datasets.Value("int64")
    rows = {"img": [{"bytes": png(0, i), "path": None} for i in range(4)], "label": labels}
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.mark.parametrize("prefix", ["hfds", "hfids"])
@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "{d} holds no rows; write the images and labels into it first"),
        ("not-parquet", "cannot read the dataset at {d} (Parquet magic bytes not found in footer. "
                        "Either the file is corrupted or this is not a parquet file.); it may be "
                        "damaged: write it again (save_to_disk, to_parquet)"),
        ("damaged", "cannot read the dataset at {saved} (Expected to read"),
        ("fractions", "{prefix}:{d}: the label column 'label' holds fractions (0.5); a classifier "
                      "needs class labels (a ClassLabel, whole numbers or strings): name another "
                      "--label-column"),
        ("unlabelled", "{prefix}:{d}:train row 2: the label -1 is not a class index in [0, 1] (-1 "
                       "marks an unlabelled row); drop or label such rows, or name another "
                       "--label-column"),
        ("missing", "{prefix}:{d}:train row 1: the label is empty; drop or label such rows"),
    ],
)  # fmt: skip
def test_a_damaged_or_empty_table_or_labels_that_are_no_classes_are_one_line(
    tmp_path, prefix, case, message
):
    data, saved = tmp_path / "d.parquet", tmp_path / "saved"
    spec = f"{prefix}:{data}"
    if case == "empty":
        table().select([]).to_parquet(data)
    elif case == "not-parquet":
        data.write_text("path,label\n")
    elif case == "damaged":
        table(4).save_to_disk(saved)
        next(saved.glob("*.arrow")).write_bytes(b"garbage" * 10)
        spec = f"{prefix}:{saved}"
    else:
        labels = {"fractions": [0.5, 1.0, 0.0, 1.5], "unlabelled": [0, 1, -1, 1]}
        _labelled(labels.get(case, [0.0, None, 1.0, 0.0])).to_parquet(data)
    with pytest.raises(DataError) as caught:
        load_data(spec, label_column="label" if case not in ("empty", "damaged") else None)
    assert str(caught.value).startswith(message.format(d=data, saved=saved, prefix=prefix))


def test_a_given_split_with_an_unknown_label_is_refused_before_training(tmp_path):
    import datasets

    strings = datasets.Features({"img": datasets.Image(), "label": datasets.Value("string")})
    rows = lambda labels: {  # noqa: E731
        "img": [{"bytes": png(0, i), "path": None} for i in range(len(labels))],
        "label": labels,
    }
    parts = {
        "train": datasets.Dataset.from_dict(rows(["cat", "dog"] * 3), features=strings),
        "test": datasets.Dataset.from_dict(rows(["cat", "fox"]), features=strings),
    }
    datasets.DatasetDict(parts).save_to_disk(tmp_path / "s")
    with pytest.raises(DataError) as caught:
        load_data(f"hfds:{tmp_path / 's'}", label_column="label")
    assert str(caught.value) == (
        f"hfds:{tmp_path / 's'}:test row 1: the label 'fox' is not among the train split's "
        "labels; drop or label such rows, or name another --label-column"
    )


def test_without_the_package_the_extra_is_named():
    error = ImportError("No module named 'datasets'", name="datasets")
    assert describe(error)[1] == (
        "this needs the optional package datasets, which is not installed: "
        "pip install 'vitkit[datasets]'"
    )


def test_a_run_without_a_model_is_sized_to_the_first_images(saved, tmp_path):
    from vitkit.train.recipes import default_choice

    choice = default_choice(f"hfds:{saved}")
    assert (choice.model, choice.model_opts) == ("vit_digits", {"img_size": 6, "in_chans": 3})
    assert choice.seen == "30 RGB images, median 5x6"  # the train split's, counted
    table().to_parquet(tmp_path / "d.parquet")
    streamed = default_choice(f"hfids:{tmp_path / 'd.parquet'}")
    assert streamed.seen == "RGB images, median 5x6 of the first 40"  # a stream is not counted
