"""idx reading (MNIST, Fashion-MNIST) on files the tests write, and the real Debian files."""

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit import get_config
from vitkit.data import DataError
from vitkit.data.idx import (
    FASHION_MNIST_DIRS,
    fashion_mnist_dir,
    load_idx_split,
    load_mnist_csv,
    read_idx,
)
from vitkit.train import TrainConfig


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def write_split(
    folder: Path, split: str, images: np.ndarray, labels: np.ndarray, compress=True
) -> None:
    prefix = "train" if split == "train" else "t10k"
    write_idx(folder / f"{prefix}-images-idx3-ubyte", images, compress)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, compress)


@pytest.mark.parametrize("compress", [True, False])
def test_reads_what_was_written(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=7, dtype=np.uint8)
    write_split(tmp_path, "test", images, labels, compress)
    x, y = load_idx_split(tmp_path, "test", "mnist")
    assert x.dtype == torch.uint8 and x.shape == (7, 28, 28)
    assert y.dtype == torch.int64 and y.tolist() == labels.tolist()
    assert np.array_equal(x.numpy(), images)


def test_truncated_and_foreign_files_are_named(tmp_path):
    images = np.zeros((4, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "a", images, compress=False)
    data = (tmp_path / "a").read_bytes()
    (tmp_path / "short").write_bytes(data[:-10])
    with pytest.raises(
        DataError, match=r"short is truncated or corrupt: header says \(4, 28, 28\)"
    ):
        read_idx(tmp_path / "short")
    (tmp_path / "text").write_bytes(b"hello world")
    with pytest.raises(DataError, match="text is not an idx file"):
        read_idx(tmp_path / "text")
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read idx file .*bad.gz"):
        read_idx(tmp_path / "bad.gz")


def test_missing_files_say_how_to_get_them(tmp_path):
    with pytest.raises(
        DataError,
        match="fashion-mnist: train-images-idx3-ubyte.* `apt-get install dataset-fashion-mnist`",
    ):
        load_idx_split(tmp_path, "train", "fashion-mnist")
    with pytest.raises(DataError, match="pass --data-dir FOLDER"):
        load_idx_split(tmp_path, "train", "mnist")


def test_mismatched_counts_are_refused(tmp_path):
    write_split(tmp_path, "train", np.zeros((3, 28, 28)), np.zeros(4))
    with pytest.raises(DataError, match="do not form an image set"):
        load_idx_split(tmp_path, "train", "mnist")


def test_mnist_csv(tmp_path):
    rows = np.zeros((3, 785), dtype=np.int64)
    rows[:, 100] = [10, 20, 30]
    rows[:, -1] = [4, 0, 9]
    path = tmp_path / "mnist.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    x, y = load_mnist_csv(path)
    assert x.shape == (3, 28, 28) and y.tolist() == [4, 0, 9]
    assert x[:, 100 // 28, 100 % 28].tolist() == [10, 20, 30]


REAL = FASHION_MNIST_DIRS[0]


@pytest.mark.skipif(
    not (REAL / "train-images-idx3-ubyte.gz").is_file(),
    reason="the Debian package dataset-fashion-mnist is not installed (.ci/run installs it)",
)
def test_real_fashion_mnist_files():
    folder = fashion_mnist_dir()
    assert folder == REAL
    x_train, y_train = load_idx_split(folder, "train", "fashion-mnist")
    x_test, y_test = load_idx_split(folder, "test", "fashion-mnist")
    assert x_train.shape == (60_000, 28, 28) and x_test.shape == (10_000, 28, 28)
    assert y_train.min() == 0 and y_train.max() == 9
    assert torch.bincount(y_train).tolist() == [6000] * 10
    assert torch.bincount(y_test).tolist() == [1000] * 10
    # Fashion-MNIST training-set normalisation constants: mean 0.2860, std 0.3530.
    pixels = x_train.float() / 255
    assert pixels.mean().item() == pytest.approx(0.2860, abs=5e-4)
    assert pixels.std().item() == pytest.approx(0.3530, abs=5e-4)


# -- as named sources of load_data and `vitkit train` ---------------------------------------


def fake_fashion(folder: Path, n_train: int = 60, n_test: int = 20) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 60, size=(n, 28, 28))
        for i, label in enumerate(labels):  # a class-dependent bright bar: learnable
            images[i, 2 * label : 2 * label + 3, :] = 250
        write_split(folder, split, images, labels)


def test_fashion_mnist_source_splits(tmp_path):
    from vitkit.data import load_data

    fake_fashion(tmp_path)
    splits = load_data(f"fashion-mnist:{tmp_path}", val_fraction=0.2, seed=0)
    # 6 images per class, 20 % -> one per class held out for val, stratified
    assert (len(splits.train), len(splits.val), len(splits.test)) == (50, 10, 20)
    assert splits.class_names[0] == "T-shirt/top" and splits.num_classes == 10
    assert splits.in_chans == 1 and splits.img_size == (28, 28)
    image, label = splits.train[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0
    assert splits.train.dataset.images.dtype == torch.uint8  # kept compact, decoded per item


def test_mnist_needs_a_folder_and_mnist_5k_reads_csv(tmp_path):
    from vitkit.data import load_data

    with pytest.raises(DataError, match="mnist: name the folder of its idx files with --data-dir"):
        load_data("mnist")
    rows = np.zeros((50, 785), dtype=np.int64)
    rows[:, -1] = np.arange(50) % 10
    path = tmp_path / "sample.csv.gz"
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    splits = load_data(f"mnist-5k:{path}", val_fraction=0.2, test_fraction=0.2)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (30, 10, 10)


def test_cli_trains_on_fashion_mnist_from_data_dir_with_its_preset(tmp_path, capsys):
    from vitkit.cli import main
    from vitkit.data import SOURCES
    from vitkit.train import RECIPES

    fake_fashion(tmp_path / "fm", n_train=100, n_test=30)
    code = main(
        [
            "train", "--data", "fashion-mnist", "--data-dir", str(tmp_path / "fm"),
            "--model-opt", "embed_dim=32", "--model-opt", "depth=1",
            "--epochs", "2", "--no-progress", "--out", str(tmp_path / "run"),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("test accuracy: ")
    assert (tmp_path / "run" / "model.safetensors").is_file()
    # no --model: the source's preset model and recipe, with the command line over them
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    model_name, recipe_name = SOURCES["fashion-mnist"].model, SOURCES["fashion-mnist"].recipe
    recipe = TrainConfig(**RECIPES[recipe_name]).to_dict()
    assert record["settings"]["recipe"] == recipe_name == "fashion-mnist"
    assert record["settings"]["model"] == model_name == "vit_mnist_hybrid"
    assert record["model"]["conv_stem"] == list(get_config("vit_mnist_hybrid").conv_stem)
    assert record["model"]["embed_dim"] == 32 and record["settings"]["epochs"] == 2
    for key in ("batch_size", "aa", "mixup", "cutmix", "crop_scale", "reprob"):
        assert record["settings"][key] == recipe[key], key
    assert record["model"]["drop_path_rate"] == 0.0  # the recipe leaves the preset's


def test_cli_missing_fashion_files_is_one_line(tmp_path, capsys):
    from vitkit.cli import main

    code = main(
        [
            "train",
            "--data",
            "fashion-mnist",
            "--data-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "apt-get install dataset-fashion-mnist" in err and "--data-dir FOLDER" in err
