"""Image folders: `root/<class>/<image>`, or already split as `root/train/<class>/<image>`
beside `val/` (also named `valid/` or `validation/`) and `test/`.

The layout a folder is read in is logged in one line (which folder is train / val / test and how
many images each holds); a sub-folder beside `train/` that is none of those is named in a
warning, not silently dropped. `evaluation_parts` picks what `vitkit eval` scores in a folder:
its held-out part when it has one, else all of it, as timm's `validate.py` does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .datasets import (
    TEST_FRACTION,
    VAL_FRACTION,
    ImageFiles,
    Splits,
    none_readable,
    split_indices,
)
from .images import IMAGE_EXTENSIONS, CorruptImageError, DataError, unreadable_images

log = logging.getLogger(__name__)

# split -> the folder names that hold it, as data sets ship them
SPLIT_FOLDERS = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}
Samples = list[tuple[str, int]]


@dataclass(frozen=True)
class FolderLayout:
    """How an image folder is laid out: `parts` maps 'train' / 'val' / 'test' to the folder
    holding that split (empty for a plain class-folder tree); `ignored` names the sub-folders
    beside them that are none of those."""

    root: Path
    parts: dict[str, Path] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


def folder_layout(root: str | os.PathLike) -> FolderLayout:
    """The layout of `root`; warns naming the sub-folders it ignores."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist or is not a folder")
    names = {d.name for d in _entries(root) if d.is_dir() and not d.name.startswith(".")}
    parts = {}
    for split, aliases in SPLIT_FOLDERS.items():
        present = [name for name in aliases if name in names]
        if len(present) > 1:
            raise DataError(
                f"data folder {root} has {' and '.join(f'{n}/' for n in present)}, all names of "
                f"the {split} split; keep one of them"
            )
        if present:
            parts[split] = root / present[0]
    if not parts:
        return FolderLayout(root)
    used = {path.name for path in parts.values()}
    ignored = tuple(sorted(names - used))
    if ignored:
        log.warning(
            "data folder %s: ignoring %s beside %s (vitkit reads train/, val/ or valid/ or "
            "validation/, and test/); rename a folder that holds one of those splits",
            root,
            ", ".join(f"{n}/" for n in ignored),
            ", ".join(f"{p.name}/" for p in parts.values()),
        )
    return FolderLayout(root, parts, ignored)


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError as err:
        raise DataError(
            f"cannot list the data folder {folder} ({err.strerror or err}); check its permissions"
        ) from None


def class_folders(
    root: Path,
    classes: list[str] | None = None,
    reference: str = "the model's classes",
    *,
    others: list[Path] | None = None,
) -> tuple[list[str], Samples]:
    """The class names of `root` (its sorted sub-folders) and its (image path, label) pairs.

    Without `classes`: a DataError when it has no classes, no images, an empty class or one
    class only. With `classes` (those of the training folder or the model, named by
    `reference` in errors) the images are labelled by them: `root` may hold some of them, not
    others. Files that are not images (by extension; hidden ones aside) are left out, and
    appended to `others` when it is given (for `report_ignored`)."""
    names = sorted(d.name for d in _entries(root) if d.is_dir() and not d.name.startswith("."))
    samples = []
    for label, name in enumerate(names):
        for file in files_under(root / name):
            if os.path.splitext(file)[1].lower() in IMAGE_EXTENSIONS:
                samples.append((file, label))
            elif others is not None and not _hidden(Path(file).relative_to(root)):
                others.append(Path(file))
    if classes is None:
        _check_classes(root, names, samples)
        return names, samples
    extra = sorted(set(names) - set(classes))
    if extra:
        raise DataError(f"{root} has classes not in {reference}: {', '.join(extra)}")
    if not samples:
        raise DataError(
            f"data folder {root} has no images in its class sub-folders; supported: "
            f"{', '.join(IMAGE_EXTENSIONS)}"
        )
    index = [list(classes).index(name) for name in names]
    return list(classes), [(path, index[label]) for path, label in samples]


def files_under(folder: Path) -> list[str]:
    """The files under `folder`, symbolic links to files too but none into folders, in the
    order of `sorted(folder.rglob("*"))`. Read with `os.scandir`, whose entries say what they
    are without a `stat` a file, and sorted as strings: several times faster than `rglob`
    and `Path` objects, and on a large folder listing is all the start-up it needs."""
    found: list[tuple[tuple[str, ...], str]] = []
    pending = [((), str(folder))]
    while pending:
        parts, path = pending.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:  # unreadable or gone: skipped, as `rglob` skips it
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(((*parts, entry.name), entry.path))
            elif _is_file(entry):
                found.append(((*parts, entry.name), entry.path))
    found.sort()  # by path components, as `Path` objects compare
    return [path for _, path in found]


def _is_file(entry: os.DirEntry) -> bool:
    """A file, or a link to one; False where it cannot be told (`Path.is_file`'s answer)."""
    try:
        return entry.is_file()
    except OSError:
        return False


def _check_classes(root: Path, classes: list[str], samples: Samples) -> None:
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


def _hidden(path: Path) -> bool:
    return any(part.startswith(".") for part in path.parts)


def report_ignored(others: Sequence[Path], root: Path) -> None:
    """One warning naming the files of `root` that are not images (by extension), if any:
    'ignored 2 files that are not images (by extension): a/notes.txt, b/x.csv'."""
    if not others:
        return
    many = f"{len(others)} files that are not images"
    what = "1 file that is not an image" if len(others) == 1 else many
    listed = _listed(os.path.relpath(file, root) for file in others)
    log.warning("data folder %s: ignored %s (by extension): %s", root, what, listed)


# The most files whose headers are read before the split. Screening costs about 0.12 ms a
# file (8 threads, 2 cores): 50,000 files take ~6 s, a million would take ~2 minutes before
# the first step. Past it a folder is listed only, and an unreadable file is skipped and
# counted when the loader reads it, as a shard's is.
SCREEN_LIMIT = 50_000


def screen(samples: Samples, *, strict: bool, root: Path) -> dict[str, str]:
    """The files of `samples` Pillow cannot identify from their header (`unreadable_images`),
    path -> why. With `strict` the first raises `CorruptImageError` naming it; when none is
    readable, a DataError names them. Past `SCREEN_LIMIT` files none is read (one line says
    so): start-up grows with the data by listing it only."""
    paths = list(dict.fromkeys(path for path, _ in samples))
    if len(paths) > SCREEN_LIMIT:
        log.info(
            "data folder %s: %s, more than %s: headers not read before the split; an "
            "unreadable image is skipped and counted when it is read",
            root,
            image_count(len(paths)),
            f"{SCREEN_LIMIT:,}",
        )
        return {}
    unreadable = unreadable_images(paths)
    if strict and unreadable:
        path, why = next(iter(unreadable.items()))
        raise CorruptImageError(f"cannot read image {path}: {why}")
    if unreadable and len(unreadable) == len(paths):
        raise DataError(none_readable(unreadable))
    return unreadable


def unreadable_line(unreadable: Mapping[str, str], root: Path) -> str:
    """'skipping 2 unreadable images: a/x.jpg, b/y.png (cannot identify image file)': the
    reason said once when they share it, the paths relative to `root`."""
    names = [os.path.relpath(path, root) for path in unreadable]
    reasons = set(unreadable.values())
    if len(reasons) == 1:
        listed = f"{_listed(names)} ({reasons.pop()})"
    else:
        listed = _listed(f"{name} ({why})" for name, why in zip(names, unreadable.values()))
    return f"skipping {plural(len(unreadable), 'unreadable image')}: {listed}"


def _listed(names: Iterable[str], shown: int = 5) -> str:
    """The first `shown` names, and how many more."""
    names = list(names)
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def plural(n: int, noun: str) -> str:
    """'1 file', '2 files'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def load_image_folder(
    path: str | os.PathLike,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    img_size: tuple[int, int] | None = None,
    skip_corrupt: bool = True,
    **_: object,
) -> Splits:
    """`root/<class>/<image>`, or `root/{train,val,test}/<class>/<image>` already split (the
    val folder may be named `valid/` or `validation/`).

    Without ready-made splits the images are split stratified by class with `seed`; a missing
    val or test folder is taken from train. With `skip_corrupt` unreadable files are skipped
    with a warning and counted (training); without, they raise naming the file (evaluation).
    Files whose header Pillow cannot identify are found before the split, named in one
    warning and left out of it, so that its counts are those of the images it reads (up to
    `SCREEN_LIMIT` files; past it, when an epoch reads them).
    """
    layout = folder_layout(path)
    if layout.parts and "train" not in layout.parts:
        found = ", ".join(f"{p.name}/" for p in layout.parts.values())
        raise DataError(
            f"data folder {layout.root} has {found} but no train/; training reads "
            f"{layout.root}/train/<class>/<image> (or class folders only); to score the "
            "folder, evaluate a checkpoint on it"
        )
    fractions = (val_fraction, test_fraction)
    classes, parts, how = _split(layout, fractions, seed, strict=not skip_corrupt)
    log.info("data folder %s: %s", layout.root, how)
    opts = {"in_chans": in_chans, "img_size": img_size, "skip_corrupt": skip_corrupt}
    return Splits(
        **{name: ImageFiles(samples, **opts) for name, samples in parts.items()},
        class_names=classes,
        in_chans=in_chans,
        img_size=None,
        mean=(0.5,) * in_chans,
        std=(0.5,) * in_chans,
        name=str(layout.root),
    )


def _split(
    layout: FolderLayout, fractions: tuple[float, float], seed: int, *, strict: bool
) -> tuple[list[str], dict[str, Samples], str]:
    """Class names, the train / val / test samples (unreadable files left out), and a line
    saying where each came from."""
    source = layout.parts.get("train", layout.root)
    others: list[Path] = []
    classes, samples = class_folders(source, others=others)
    parts = {
        name: class_folders(layout.parts[name], classes, str(source), others=others)[1]
        for name in ("val", "test")
        if name in layout.parts
    }
    report_ignored(others, layout.root)
    everything = samples + [sample for part in parts.values() for sample in part]
    unreadable = screen(everything, strict=strict, root=layout.root)
    if unreadable:
        log.warning("data folder %s: %s", layout.root, unreadable_line(unreadable, layout.root))
        samples = [s for s in samples if s[0] not in unreadable]
        parts = {name: [s for s in part if s[0] not in unreadable] for name, part in parts.items()}
    cut = [0.0 if name in parts else f for name, f in zip(("val", "test"), fractions)]
    labels = [label for _, label in samples]
    train, val, test = split_indices(len(samples), cut, seed, labels)
    for name, indices in (("val", val), ("test", test)):
        parts.setdefault(name, [samples[i] for i in indices])
    parts["train"] = [samples[i] for i in train]
    described = []
    for name in ("train", "val", "test"):
        where = layout.parts.get(name)
        origin = f"{where.name}/" if where is not None else f"cut from {_rel(source, layout)}"
        described.append(f"{name} {origin} ({image_count(len(parts[name]))})")
    how = ", ".join(described) + f"; {len(classes)} classes"
    if any(name not in layout.parts for name in ("train", "val", "test")):
        how += f"; split seed {seed}"
    return classes, parts, how


def _rel(folder: Path, layout: FolderLayout) -> str:
    return f"{folder.name}/" if folder != layout.root else "the class folders"


def image_count(n: int) -> str:
    """'1 image', '5 images'."""
    return f"{n} image" if n == 1 else f"{n} images"
