"""Hugging Face datasets on disk as sources: `--data hfds:PATH` (map-style, memory-mapped
Arrow) and `--data hfids:PATH` (streaming, `datasets.IterableDataset`), as timm names them.

PATH is a dataset saved with `save_to_disk` (a `Dataset` or a `DatasetDict`), Parquet or Arrow
files (a file, a folder of them or a glob), or a builder over local files:
`imagefolder:FOLDER`, `csv:FILE`. Nothing is downloaded: a name that is not on disk ends
with one line saying how to save it. The image column is the one with an `Image` feature
(or `--image-column`: an `Image` feature, or strings that are paths, relative to the data),
the label column the one with a `ClassLabel` feature (or `--label-column`: a `ClassLabel`,
integers, or strings, numbered in sorted order); the class names are the `ClassLabel`'s.
Images are decoded by vitkit's decoder (`images.open_image`: EXIF orientation, every PIL mode,
unreadable ones skipped and counted), not by `datasets`.

Splits: the dataset's `train`, `validation` (or `val`, `valid`) and `test`; one it lacks is cut
from train with `--val-fraction`, `--test-fraction` and `--seed` (stratified by label for
map-style data, by place for a stream). A stream is split per rank with `datasets`'
`split_dataset_by_node`; a stream whose held-out parts are cut from it is read whole by each
rank, which keeps every N-th of its samples. Needs `pip install 'vitkit[datasets]'`.
"""

from __future__ import annotations

import glob
import io
import itertools
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from .datasets import TEST_FRACTION, VAL_FRACTION, Splits, Subset, split_indices
from .folders import image_count
from .images import CorruptImageError, DataError, open_image, open_image_bytes
from .streams import StreamSource

log = logging.getLogger(__name__)

BUILDERS = ("imagefolder", "csv", "parquet", "arrow", "json")  # `hfds:BUILDER:PATH`
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid"), "test": ("test",)}
BATCH = 64  # rows a stream reads at a time


# -- opening ----------------------------------------------------------------------------------


def open_dataset(spec: str, *, streaming: bool) -> Any:
    """The `Dataset` / `DatasetDict` (or their iterable forms) of an `hfds:` / `hfids:` path;
    one that cannot be read (damaged Arrow or Parquet files) is a DataError naming it."""
    import datasets
    import pyarrow

    try:
        return _open(spec, streaming)
    except DataError:
        raise
    except (ValueError, OSError, pyarrow.ArrowException, datasets.exceptions.DatasetsError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise DataError(
            f"cannot read the dataset at {spec} ({reason}); it may be damaged: write it again "
            "(save_to_disk, to_parquet)"
        ) from None


def _open(spec: str, streaming: bool) -> Any:
    import datasets

    builder, sep, rest = spec.partition(":")
    if sep and builder in BUILDERS:
        return _build(builder, rest, streaming)
    path = Path(spec)
    if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
        saved = datasets.load_from_disk(str(path))
        if not streaming:
            return saved
        if isinstance(saved, datasets.DatasetDict):
            return datasets.IterableDatasetDict({k: _iterable(v) for k, v in saved.items()})
        return _iterable(saved)
    files = _data_files(spec)
    if files:
        return _build("parquet" if files[0].endswith(".parquet") else "arrow", spec, streaming)
    if path.is_dir():
        raise DataError(
            f"{spec} holds no saved dataset (dataset_dict.json or state.json) and no Parquet or "
            f"Arrow files; for class folders of images use --data hfds:imagefolder:{spec}"
        )
    raise DataError(
        f"no dataset on disk at {spec}; vitkit downloads nothing at run time: save it once "
        f'with python -c "import datasets; datasets.load_dataset({spec!r})'
        f".save_to_disk('{Path(spec).name}')\" and pass --data hfds:{Path(spec).name}"
    )


def _data_files(spec: str) -> list[str]:
    """The Parquet / Arrow files of a file, a folder or a glob."""
    path = Path(spec)
    found = sorted(glob.glob(str(path / "**" / "*"), recursive=True)) if path.is_dir() else []
    found = found or sorted(glob.glob(spec))
    return [f for f in found if f.endswith((".parquet", ".arrow")) and Path(f).is_file()]


def _build(builder: str, path: str, streaming: bool) -> Any:
    """`datasets.load_dataset` of a packaged builder over local files only."""
    import datasets

    if not glob.glob(path):
        raise DataError(f"hfds: {builder} data {path} does not exist")
    if builder == "imagefolder":
        where = {"data_dir": path}
    else:
        files = _data_files(path) if builder in ("parquet", "arrow") else sorted(glob.glob(path))
        where = {"data_files": files}
    if builder == "parquet" and not _parquet_rows(files):
        raise DataError(f"{path} holds no rows; write the images and labels into it first")
    return datasets.load_dataset(builder, **where, streaming=streaming)


def _parquet_rows(files: Sequence[str]) -> int:
    """The rows of Parquet files, read from their footers (`datasets` fails on none)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(file).metadata.num_rows for file in files)


def _iterable(dataset: Any) -> Any:
    """A saved `Dataset` as a stream, in shards that ranks can divide."""
    return dataset.to_iterable_dataset(num_shards=min(len(dataset), 8) or 1)


# -- columns ----------------------------------------------------------------------------------


def _columns(features: Any, image: str | None, label: str | None, where: str) -> tuple[str, str]:
    """The image and label columns: those named, else the `Image` and `ClassLabel` ones."""
    import datasets

    names = list(features)
    for given, what in ((image, "--image-column"), (label, "--label-column")):
        if given is not None and given not in names:
            raise DataError(f"{where} has no column {given!r} ({what}); its columns: {names}")
    image = image or next((n for n, f in features.items() if isinstance(f, datasets.Image)), None)
    label = label or next(
        (n for n, f in features.items() if isinstance(f, datasets.ClassLabel)), None
    )
    for found, what, kind in ((image, "image", "an Image"), (label, "label", "a ClassLabel")):
        if found is None:
            raise DataError(
                f"{where} has no column with {kind} feature; name its {what} column with "
                f"--{what}-column (its columns: {', '.join(names)})"
            )
    return image, label  # type: ignore[return-value]


def _class_names(
    feature: Any, values: Sequence[Any], column: str, where: str
) -> tuple[list[str], dict[Any, int] | None]:
    """The class names and, for labels that are not indices (strings), their numbering; a
    column of fractions (a score or a regression target) is refused."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), None
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (int, float)) for v in present):
        fraction = next((v for v in present if not float(v).is_integer()), None)
        if fraction is not None:
            raise DataError(
                f"{where}: the label column {column!r} holds fractions ({fraction}); a "
                "classifier needs class labels (a ClassLabel, whole numbers or strings): name "
                "another --label-column"
            )
        return [str(i) for i in range(max(0, int(max(present))) + 1)], None
    names = sorted({str(v) for v in present})
    return names, {name: i for i, name in enumerate(names)}


def _indices(values: Sequence[Any], numbering: dict | None, count: int, where: str) -> list[int]:
    """The class index of each label value; the first that has none (an empty label, -1 for
    an unlabelled row, a label train does not have) is a DataError naming its row."""
    indices = []
    for row, value in enumerate(values):
        if value is None:
            problem = "is empty"
        elif numbering is not None:
            index = numbering.get(str(value))
            problem = f"{str(value)!r} is not among the train split's labels"
        else:
            index = int(value)
            problem = f"{index} is not a class index in [0, {count - 1}]" + (
                " (-1 marks an unlabelled row)" if index == -1 else ""
            )
        if value is None or index is None or not 0 <= index < count:
            raise DataError(
                f"{where} row {row}: the label {problem}; drop or label such rows, or name "
                "another --label-column"
            )
        indices.append(index)
    return indices


class _Decoder:
    """(PIL image, class index) of a row; unreadable images skipped and counted per process."""

    def __init__(
        self,
        image: str,
        label: str,
        numbering: dict | None,
        *,
        root: str,
        in_chans: int,
        skip_corrupt: bool,
    ) -> None:
        self.image, self.label, self.numbering, self.root = image, label, numbering, root
        self.in_chans, self.skip_corrupt = in_chans, skip_corrupt
        self.corrupt: dict[str, str] = {}

    def __call__(self, row: dict[str, Any], where: str) -> tuple[Any, int] | None:
        value, label = row[self.image], row[self.label]
        label = self.numbering[str(label)] if self.numbering else int(label)
        if isinstance(value, dict) and value.get("bytes") is not None:
            where = f"{where} ({value['path']})" if value.get("path") else where
        try:
            if isinstance(value, dict) and value.get("bytes") is not None:
                return open_image_bytes(value["bytes"], where, in_chans=self.in_chans), label
            path = value if isinstance(value, str) else value["path"]  # a path
            path = path if os.path.isabs(path) else os.path.join(self.root, path)
            return open_image(path, in_chans=self.in_chans), label
        except CorruptImageError as err:
            if not self.skip_corrupt:
                raise
            reason = str(err).split(": ", 1)[-1]
            if where not in self.corrupt:
                log.warning("skipping %s: %s", where, reason)
                self.corrupt[where] = reason
            return None


# -- map-style and streams ------------------------------------------------------------------


class HfImages(Dataset):
    """A map-style `datasets.Dataset`'s rows as (PIL image, class index)."""

    def __init__(self, dataset: Any, decode: _Decoder, name: str) -> None:
        self.dataset, self.decode, self.name = dataset, decode, name
        self.corrupt = decode.corrupt  # what `unreadable_files` reads

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        return self.decode(self.dataset[index], f"{self.name}[{index}]")


class HfStream(StreamSource):
    """A `datasets.IterableDataset`'s rows, read in order (`ds.iter`, which leaves the split
    between loader workers to the engine), decoded by `apply`; `keep` holds the places of
    this split's rows when held-out parts were cut from the same stream."""

    def __init__(
        self,
        dataset: Any,
        decode: _Decoder,
        *,
        length: int,
        name: str,
        keep: frozenset[int] | None = None,
    ) -> None:
        self.dataset, self.decode, self.length, self.name = dataset, decode, length, name
        self.keep = keep
        self.corrupt = decode.corrupt

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        return (item for item in map(self.apply, self.part(0, 1)) if item is not None)

    def part(self, index: int, count: int) -> Iterator[tuple[str, dict[str, Any]]]:
        if self.keep is None:
            from datasets.distributed import split_dataset_by_node

            node = split_dataset_by_node(self.dataset, rank=index, world_size=count)
            return ((f"{self.name} part {index}", row) for row in _rows(node))
        kept = (
            (f"{self.name}[{place}]", row)
            for place, row in enumerate(_rows(self.dataset))
            if place in self.keep
        )
        return itertools.islice(kept, index, None, count)

    def apply(self, item: tuple[str, dict[str, Any]]) -> tuple[Any, int] | None:
        return self.decode(item[1], item[0])


def _rows(dataset: Any) -> Iterator[dict[str, Any]]:
    """The rows of an `IterableDataset`, all of them in any process."""
    for batch in dataset.iter(batch_size=BATCH):
        columns = list(batch)
        yield from (dict(zip(columns, values)) for values in zip(*batch.values()))


def first_images(spec: str, limit: int, *, streaming: bool) -> tuple[list[Any], int | None]:
    """The first `limit` images of the train split of an `hfds:` / `hfids:` path (bytes as
    files, or paths), for a look at their sizes, and how many it holds (None for a stream);
    none when it has no `Image` column."""
    import datasets

    train = _parts(open_dataset(spec, streaming=streaming))["train"]
    features = train.features or {}
    image = next((n for n, f in features.items() if isinstance(f, datasets.Image)), None)
    if image is None:
        return [], None
    count = None if streaming else len(train)
    if not streaming:
        train = train.to_iterable_dataset()
    rows = itertools.islice(_rows(_undecoded(train.select_columns([image]), image)), limit)
    values = [row[image] for row in rows]
    return [io.BytesIO(v["bytes"]) if v.get("bytes") else v["path"] for v in values], count


# -- the sources ----------------------------------------------------------------------------


def _parts(opened: Any) -> dict[str, Any]:
    """train / val / test of a dataset or a dict of splits (None where it has none)."""
    if not hasattr(opened, "keys"):
        return {"train": opened, "val": None, "test": None}
    named = {
        part: next((opened[n] for n in names if n in opened), None)
        for part, names in SPLIT_NAMES.items()
    }
    if named["train"] is None:
        raise DataError(
            f"the dataset has no train split (its splits: {', '.join(opened)}); save the split "
            "to train on as 'train'"
        )
    return named


def load_hf_dataset(
    path: str | None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    skip_corrupt: bool = True,
    image_column: str | None = None,
    label_column: str | None = None,
    **_: Any,
) -> Splits:
    """`hfds:PATH`: map-style splits of a Hugging Face dataset on disk (module docstring)."""
    parts = _parts(open_dataset(_required(path, "hfds"), streaming=False))
    train = parts["train"]
    image, label = _columns(train.features, image_column, label_column, path)
    if len(train) == 0:
        raise DataError(f"hfds:{path}: the train split holds no rows; save the images into it")
    names, numbering = _class_names(train.features[label], train[label], label, f"hfds:{path}")
    train = _undecoded(train, image)
    decode = _Decoder(
        image, label, numbering, root=_root(path), in_chans=in_chans, skip_corrupt=skip_corrupt
    )
    labels = _indices(train[label], numbering, len(names), f"hfds:{path}:train")
    places = _places(parts, labels, (val_fraction, test_fraction), seed)
    whole = HfImages(train, decode, f"{path}:train")
    splits = {}
    for part in ("train", "val", "test"):
        given = parts[part] if part != "train" else None
        if given is not None:
            _indices(given[label], numbering, len(names), f"hfds:{path}:{part}")
            splits[part] = HfImages(_undecoded(given, image), decode, f"{path}:{part}")
        else:
            keep = places[part]
            splits[part] = whole if len(keep) == len(train) else Subset(whole, keep)
    return _splits(splits, names, in_chans, f"hfds:{path}")


def _places(
    parts: dict[str, Any], labels: list[int], fractions: tuple[float, float], seed: int
) -> dict[str, list[int]]:
    """The rows of train that each part takes (`labels`: their class indices): val and test
    cut, stratified by label, where the dataset has no such split (then train keeps the
    rest)."""
    cut = [0.0 if parts[p] is not None else f for p, f in zip(("val", "test"), fractions)]
    return dict(zip(("train", "val", "test"), split_indices(len(labels), cut, seed, labels)))


def _undecoded(dataset: Any, column: str) -> Any:
    """`dataset` with its `Image` column left as bytes / paths, for vitkit's decoder."""
    import datasets

    if not isinstance(dataset.features[column], datasets.Image):
        return dataset
    return dataset.cast_column(column, datasets.Image(decode=False))


def load_hf_stream(
    path: str | None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    skip_corrupt: bool = True,
    image_column: str | None = None,
    label_column: str | None = None,
    **_: Any,
) -> Splits:
    """`hfids:PATH`: streaming splits of a Hugging Face dataset on disk (module docstring).
    The label column is read through once: the samples' count (the length hint) and, for
    labels that are not a `ClassLabel`, the class names."""
    parts = _parts(open_dataset(_required(path, "hfids"), streaming=True))
    train = parts["train"]
    if train.features is None:
        raise DataError(
            f"hfids:{path} does not state its columns' types; read it map-style with hfds:{path}"
        )
    image, label = _columns(train.features, image_column, label_column, path)
    values = _label_values(train, label)
    if not values:
        raise DataError(f"hfids:{path}: the train split holds no rows; save the images into it")
    names, numbering = _class_names(train.features[label], values, label, f"hfids:{path}")
    decode = _Decoder(
        image, label, numbering, root=_root(path), in_chans=in_chans, skip_corrupt=skip_corrupt
    )
    labels = _indices(values, numbering, len(names), f"hfids:{path}:train")
    places = _places(parts, labels, (val_fraction, test_fraction), seed)
    streams = {}
    for part in ("train", "val", "test"):
        given = parts[part] if part != "train" else None
        name = f"hfids:{path}:{part}"
        if given is not None:
            length = len(_indices(_label_values(given, label), numbering, len(names), name))
            streams[part] = HfStream(_undecoded(given, image), decode, length=length, name=name)
        else:
            keep = places[part]
            whole = len(keep) == len(values)
            streams[part] = HfStream(
                _undecoded(train, image),
                decode,
                length=len(keep),
                name=name,
                keep=None if whole else frozenset(keep),
            )
    return _splits(streams, names, in_chans, f"hfids:{path}")


def _label_values(dataset: Any, label: str) -> list[Any]:
    """Every value of the label column of a stream (its other columns are not read)."""
    return [row[label] for row in _rows(dataset.select_columns([label]))]


def _required(path: str | None, kind: str) -> str:
    if not path:
        raise DataError(
            f"{kind}: name the dataset on disk, e.g. --data {kind}:cifar10-saved (save_to_disk), "
            f"{kind}:data/train.parquet or {kind}:imagefolder:photos"
        )
    return path


def _root(path: str) -> str:
    """Where relative image paths of a csv's column are read from: the csv's folder."""
    location = path.partition(":")[2] if path.split(":")[0] in BUILDERS else path
    first = sorted(glob.glob(location))[:1]
    return str(Path(first[0]).parent) if first and Path(first[0]).is_file() else location


def _splits(parts: dict[str, Any], names: list[str], in_chans: int, name: str) -> Splits:
    log.info(
        "%s: %s; %d classes",
        name,
        ", ".join(f"{p} {image_count(len(d))}" for p, d in parts.items()),
        len(names),
    )
    return Splits(
        **parts,
        class_names=names,
        in_chans=in_chans,
        img_size=None,
        mean=(0.5,) * in_chans,
        std=(0.5,) * in_chans,
        name=name,
    )
