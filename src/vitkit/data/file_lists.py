"""File lists: a CSV (`path,label` or `file,label`) or JSON Lines file (`{"path": ...,
"label": ...}`) naming each image and its label(s), paths relative to the list's folder.

`--data list:train.csv`. Several labels of one image are separated by `;` (`cat;dog`), or
given as a JSON list: such a list is multi-label (each image may be of several classes, as in
Pascal VOC or COCO's classification). The classes are those of `classes.txt` beside the list
(one name per line, in the model's order) when it exists, else the sorted labels of the train
list. A list named `train.<ext>` takes `val.<ext>` (or `valid` / `validation`) and
`test.<ext>` beside it as its ready-made splits, as timm's `--train-split` / `--val-split`
name theirs; a part without its list is cut from train with the seed, as for image folders.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..files import file_kind
from .datasets import TEST_FRACTION, VAL_FRACTION, ImageFiles, Splits, split_indices
from .folders import SPLIT_FOLDERS, image_count
from .images import DataError

log = logging.getLogger(__name__)

CLASS_MAP = "classes.txt"
LIST_SUFFIXES = (".csv", ".jsonl")
PATH_COLUMNS = ("path", "file")
LABEL_SEPARATOR = ";"


@dataclass(frozen=True)
class Entry:
    """One line of a list: the image's path (resolved against the list's folder), its label
    names, and the line it was read from (1 is a CSV's header)."""

    path: str
    labels: tuple[str, ...]
    line: int


class MultiLabelFiles(ImageFiles):
    """Image files with several labels each: samples carry a tuple of class indices, items a
    multi-hot float target (num_classes,), as timm's multi-label targets."""

    def __init__(self, samples: list[tuple[str, Any]], *, num_classes: int, **opts: Any) -> None:
        super().__init__(samples, **opts)
        self.num_classes = num_classes

    def load(self, index: int, **kwargs: Any) -> tuple[Any, Tensor] | None:
        item = super().load(index, **kwargs)
        if item is None:
            return None
        image, labels = item
        return image, multi_hot(labels, self.num_classes)


def multi_hot(indices: tuple[int, ...], num_classes: int) -> Tensor:
    """Class indices -> a float (num_classes,) target with 1 at each."""
    target = torch.zeros(num_classes)
    target[list(indices)] = 1.0
    return target


def read_list(path: str | os.PathLike) -> list[Entry]:
    """The entries of a CSV or JSONL list (UTF-8, with or without a byte-order mark); each
    image must exist and be listed once (a DataError naming the line); an empty list is
    refused."""
    path = Path(path)
    _check_list_file(path)
    if path.suffix.lower() not in LIST_SUFFIXES:
        raise DataError(
            f"file list {path}: unknown format {path.suffix or '(no suffix)'}; write a .csv "
            '(header path,label) or a .jsonl ({"path": ..., "label": ...} per line)'
        )
    text = _read_text(path)
    rows = _jsonl_rows(text, path) if path.suffix.lower() == ".jsonl" else _csv_rows(text, path)
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for line, file, label in rows:
        labels = _labels(label, path, line)
        image = path.parent / file
        if not file or not image.is_file():
            raise DataError(
                f"{path} line {line}: image {file or '(empty path)'} not found (looked for "
                f"{image}; paths are relative to the list's folder)"
            )
        first = seen.setdefault(os.path.normpath(image), line)
        if first != line:
            raise DataError(
                f"{path} line {line}: image {file} is listed again (first on line {first}); "
                f"list each image once, with all its labels ({LABEL_SEPARATOR}-separated)"
            )
        entries.append(Entry(str(image), labels, line))
    if not entries:
        raise DataError(f"file list {path} lists no images; add one line per image")
    return entries


def _check_list_file(path: Path) -> None:
    """A DataError unless `path` is a regular file (a FIFO is never opened: it would block)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"file list {path} does not exist") from None
    except OSError as err:
        raise DataError(f"cannot read file list {path} ({err.strerror or err})") from None
    if stat.S_ISDIR(mode):
        raise DataError(
            f"file list {path} is a folder, not a file; name a .csv or .jsonl file (class "
            f"folders of images are --data {path})"
        )
    if not stat.S_ISREG(mode):
        raise DataError(
            f"file list {path} is {file_kind(mode)}, not a regular file; name a .csv or .jsonl file"
        )


def _read_text(path: Path) -> str:
    """The list's text, decoded as UTF-8 (a leading byte-order mark, as Excel writes, dropped);
    a DataError naming the line of the first byte that is not UTF-8."""
    raw = path.read_bytes()
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(
            f"{path} line {line}: byte 0x{raw[err.start]:02x} is not UTF-8 text; save the list "
            "as UTF-8"
        ) from None


def _csv_rows(text: str, path: Path) -> list[tuple[int, str, Any]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        raise DataError(f"file list {path} is empty; its first line must be the header path,label")
    header = [name.strip().lower() for name in rows[0]]
    column = next((name for name in PATH_COLUMNS if name in header), None)
    if column is None or "label" not in header:
        raise DataError(
            f"{path}: header {','.join(rows[0])!r} lacks a path (or file) and a label column; "
            "the first line must be path,label"
        )
    at, label_at = header.index(column), header.index("label")
    found = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(at, label_at):
            raise DataError(f"{path} line {line}: {len(row)} columns; expected {len(header)}")
        found.append((line, row[at].strip(), row[label_at]))
    return found


def _jsonl_rows(text: str, path: Path) -> list[tuple[int, str, Any]]:
    found = []
    for line, row_text in enumerate(text.split("\n"), start=1):
        if not row_text.strip():
            continue
        try:
            row = json.loads(row_text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {line}: not JSON ({err.msg})") from None
        file = row.get("path", row.get("file")) if isinstance(row, dict) else None
        if not isinstance(file, str) or "label" not in row:
            raise DataError(
                f'{path} line {line}: expected an object with "path" and "label", e.g. '
                '{"path": "cat/1.png", "label": "cat"}'
            )
        found.append((line, file.strip(), row["label"]))
    return found


def _labels(label: Any, path: Path, line: int) -> tuple[str, ...]:
    """A label cell ('cat', 'cat;dog', a JSON string, whole number or list of them) -> its
    label names; JSON null, a fraction, true / false or an object is refused."""
    values = label if isinstance(label, list) else [label]
    for value in values:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            raise DataError(
                f"{path} line {line}: label {json.dumps(value)} is not a class name; give a "
                "string, a whole number, or a list of them"
            )
    if isinstance(label, list):
        names = [str(name).strip() for name in label if name is not None]
    else:
        names = [] if label is None else [n.strip() for n in str(label).split(LABEL_SEPARATOR)]
    names = [name for name in names if name]
    if not names:
        raise DataError(f"{path} line {line}: no label; give one (or several separated by ;)")
    return tuple(dict.fromkeys(names))


def read_class_map(path: str | os.PathLike) -> list[str]:
    """The class names of a class map file, one per line in the model's order."""
    names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    names = [name for name in names if name]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"{path} names {', '.join(repeated)} twice; list each class once")
    if len(names) < 2:
        raise DataError(f"{path} names {len(names)} class(es); a classifier needs at least two")
    return names


def class_names(entries: list[Entry], list_path: Path) -> list[str]:
    """`classes.txt` beside the list when it exists, else the list's sorted labels."""
    mapped = list_path.parent / CLASS_MAP
    if mapped.is_file():
        return read_class_map(mapped)
    names = sorted({name for entry in entries for name in entry.labels})
    if len(names) < 2:
        raise DataError(
            f"{list_path} has one label ({names[0]}); a classifier needs at least two classes"
        )
    return names


def labelled(
    entries: list[Entry], classes: list[str], list_path: Path, source: str
) -> list[tuple[str, tuple[int, ...]]]:
    """(path, class indices) of each entry; a label outside `classes` (named by `source`)
    is refused naming its line."""
    index = {name: i for i, name in enumerate(classes)}
    samples = []
    for entry in entries:
        unknown = [name for name in entry.labels if name not in index]
        if unknown:
            raise DataError(
                f"{list_path} line {entry.line}: label {unknown[0]!r} is not in {source}; add it "
                "there or correct the line"
            )
        samples.append((entry.path, tuple(index[name] for name in entry.labels)))
    return samples


def split_lists(list_path: Path) -> dict[str, Path]:
    """The ready-made split lists beside `train.<ext>`: {'val': ..., 'test': ...} found."""
    if list_path.stem.lower() != "train":
        return {}
    found = {}
    for split in ("val", "test"):
        names = [
            n
            for n in SPLIT_FOLDERS[split]
            if (list_path.parent / f"{n}{list_path.suffix}").is_file()
        ]
        if len(names) > 1:
            raise DataError(
                f"{list_path.parent} has {' and '.join(n + list_path.suffix for n in names)}, "
                f"all lists of the {split} split; keep one of them"
            )
        if names:
            found[split] = list_path.parent / f"{names[0]}{list_path.suffix}"
    return found


def load_file_list(
    path: str | os.PathLike | None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    img_size: tuple[int, int] | None = None,
    skip_corrupt: bool = True,
    **_: object,
) -> Splits:
    """The images of a file list (`list:PATH`), its val / test lists beside it or parts cut
    with `seed` (stratified by class for single labels). `splits.extra['multi_label']` says
    whether any image has several labels."""
    if path is None or not str(path).strip():
        raise DataError("list: name the file list, e.g. --data list:train.csv")
    list_path = Path(path)
    entries = read_list(list_path)
    classes = class_names(entries, list_path)
    source = (
        str(list_path.parent / CLASS_MAP)
        if (list_path.parent / CLASS_MAP).is_file()
        else f"{list_path.name}'s labels"
    )
    parts = {"train": labelled(entries, classes, list_path, source)}
    lists = split_lists(list_path)
    for split, other in lists.items():
        parts[split] = labelled(read_list(other), classes, other, source)
    multi = any(len(labels) > 1 for samples in parts.values() for _, labels in samples)
    samples = parts["train"]
    cut = [
        0.0 if name in parts else f
        for name, f in zip(("val", "test"), (val_fraction, test_fraction))
    ]
    strata = None if multi else [labels[0] for _, labels in samples]
    train, val, test = split_indices(len(samples), cut, seed, strata)
    for name, indices in (("val", val), ("test", test)):
        parts.setdefault(name, [samples[i] for i in indices])
    parts["train"] = [samples[i] for i in train]
    opts = {"in_chans": in_chans, "img_size": img_size, "skip_corrupt": skip_corrupt}
    log.info("file list %s: %s", list_path, _described(parts, lists, classes, multi, seed))
    return Splits(
        **{name: _dataset(items, len(classes), multi, opts) for name, items in parts.items()},
        class_names=classes,
        in_chans=in_chans,
        img_size=None,
        mean=(0.5,) * in_chans,
        std=(0.5,) * in_chans,
        name=str(list_path),
        extra={"multi_label": multi},
    )


def whole_list(
    path: str | os.PathLike, classes: list[str] | None, **opts: Any
) -> tuple[ImageFiles, list[str]]:
    """Every image of a list, labelled by `classes` (the model's; default: the list's own),
    for `vitkit eval` of a list other than the one trained on."""
    list_path = Path(path)
    entries = read_list(list_path)
    names = list(classes) if classes else class_names(entries, list_path)
    source = "the model's classes" if classes else f"{list_path.name}'s labels"
    samples = labelled(entries, names, list_path, source)
    multi = any(len(labels) > 1 for _, labels in samples)
    return _dataset(samples, len(names), multi, opts), names


def _dataset(samples: list, num_classes: int, multi: bool, opts: dict[str, Any]) -> ImageFiles:
    if multi:
        return MultiLabelFiles(samples, num_classes=num_classes, **opts)
    return ImageFiles([(path, labels[0]) for path, labels in samples], **opts)


def _described(
    parts: dict[str, list], lists: dict[str, Path], classes: list[str], multi: bool, seed: int
) -> str:
    """'train (80 images), val val.csv (10 images), test cut from train (10 images); 3
    classes, multi-label; split seed 0'."""
    shown = []
    for name in ("train", "val", "test"):
        origin = (
            ""
            if name == "train"
            else f" {lists[name].name}"
            if name in lists
            else " cut from train"
        )
        shown.append(f"{name}{origin} ({image_count(len(parts[name]))})")
    text = ", ".join(shown) + f"; {len(classes)} classes" + (", multi-label" if multi else "")
    return text + (f"; split seed {seed}" if len(lists) < 2 else "")
