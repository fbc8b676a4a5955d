"""Tar shards in webdataset's layout (`--data 'wds:shards/train-{0000..0127}.tar'`), read as a
stream, and written from an image folder.

A shard is a plain tar file; the members of one sample share a key (`000017.jpg`,
`000017.cls`: the name up to its first dot), as webdataset groups them. The image is the
member with an image extension (`.jpg`, `.jpeg`, `.png`, `.webp`, ...), the class index is the
`.cls` member's text; other members are ignored. Beside the shards an `_info.json` in timm's
format (`reader_wds.py`) gives each split's shards and their sample counts:
`{"splits": {"train": {"name": "train", "num_samples": N, "filenames": [...],
"shard_lengths": [...]}}, "classes": [...]}` (`classes` is vitkit's, read when present).
Without it the shards are counted from their tar headers, and the classes read from the
`.cls` members.

The shards are read with the standard `tarfile` module rather than the webdataset package:
the engine's `StreamPart` already shuffles, splits per worker and resumes by samples seen, so
a reader only has to give its part in a fixed order, and owning it keeps the split per rank,
the skipped members and the count exact, with no dependency. webdataset reads the shards
`write_shards` writes (a test checks), and vitkit reads those of webdataset's `TarWriter`.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import random
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import atomic_write, check_output, file_kind
from .datasets import TEST_FRACTION, VAL_FRACTION, Splits, split_indices
from .folders import class_folders, folder_layout, image_count
from .images import IMAGE_EXTENSIONS, CorruptImageError, DataError, open_image_bytes
from .streams import StreamSource

log = logging.getLogger(__name__)

INFO_FILES = ("_info.json", "info.json")  # where timm's reader looks, in its order
IMAGE_KEYS = tuple(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
MAX_SHARDS = 1_000_000  # the most names a pattern may give (a typo such as {0..99999999})
MAX_CORRUPT = 0.01  # the share of a split's samples that may be skipped before a run fails
VAL_SPLITS, TEST_SPLITS = ("validation", "val"), ("test",)
Raw = tuple[str, bytes | None, bytes | None]  # (shard:key, image bytes, .cls bytes)


# -- names ----------------------------------------------------------------------------------


def expand_pattern(pattern: str) -> list[str]:
    """A brace pattern as webdataset's (braceexpand): `train-{0000..0003}.tar` -> the four
    names, zero-padded as written; `{a,b}` lists; several braces multiply. An unmatched brace,
    an empty one, a range that is not two whole numbers, or more than `MAX_SHARDS` names is a
    DataError."""
    depth = 0
    for char in pattern:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0:
        raise DataError(
            f"shard pattern {pattern!r} has an unmatched {'{' if depth > 0 else '}'}; write "
            "a range such as train-{0000..0127}.tar or a list such as {a,b}"
        )
    count = 1
    for body in re.findall(r"\{([^{}]*)\}", pattern):
        count *= _brace_size(body, pattern)
    if count > MAX_SHARDS:
        raise DataError(
            f"shard pattern {pattern!r} names {count:,} shards, more than {MAX_SHARDS:,}; "
            "check its range"
        )
    return _expand(pattern)


def _brace_size(body: str, pattern: str) -> int:
    """How many names a brace's body gives; a DataError for one that is no range or list."""
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        return abs(int(numbers.group(2)) - int(numbers.group(1))) + 1
    if not body or ".." in body:
        raise DataError(
            f"shard pattern {pattern!r}: {{{body}}} is neither a range of whole numbers such as "
            "{0000..0127} nor a list such as {a,b}"
        )
    return body.count(",") + 1


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail, body = pattern[: match.start()], pattern[match.end() :], match.group(1)
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        first, last = numbers.groups()
        padded = any(len(n) > 1 and n.startswith("0") for n in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if int(last) >= int(first) else -1
        items = [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    else:
        items = body.split(",")
    return [name for item in items for name in _expand(head + item + tail)]


def _split_name(name: str) -> tuple[str, str] | None:
    """A member's (key, lower-case extension), as webdataset's `base_plus_ext`."""
    match = re.fullmatch(r"((?:.*/|)[^./]+)\.([^/]*)", name)
    return None if match is None else (match.group(1), match.group(2).lower())


# -- the info file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One tar file of a split: its path, its samples, and the place of its first sample in
    the split's order (where a held-out part is cut)."""

    path: str
    length: int
    offset: int


def read_info(folder: Path) -> dict[str, Any]:
    """The shards' info file (`_info.json`, else `info.json`) in `folder`, or {}."""
    for name in INFO_FILES:
        file = folder / name
        if file.is_file():
            try:
                info = json.loads(file.read_text())
            except (OSError, ValueError) as err:
                raise DataError(f"cannot read the shards' info file {file} ({err})") from None
            if not isinstance(info, dict):
                raise DataError(f"{file} is not a shards' info file (not a JSON object)")
            return info
    return {}


def _info_lengths(info: dict[str, Any]) -> dict[str, int]:
    """File name -> samples, from every split of the info file."""
    lengths = {}
    for split in info.get("splits", {}).values():
        lengths.update(zip(split.get("filenames", ()), split.get("shard_lengths", ())))
    return lengths


def _named_split(info: dict[str, Any], names: Sequence[str], taken: set[str]) -> list[str]:
    """The files of the first split of the info file called one of `names` whose shards are
    not those given (`taken`), or []."""
    for name in names:
        files = info.get("splits", {}).get(name, {}).get("filenames", [])
        if files and not taken.intersection(files):
            return list(files)
    return []


# -- reading --------------------------------------------------------------------------------


def _samples(path: str) -> Iterator[Raw]:
    """The samples of one shard in order: consecutive members with one key form a sample.
    A shard that cannot be read (further) raises DataError naming it."""
    key, image, label = None, None, None
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                parts = _split_name(member.name) if member.isfile() else None
                if parts is None:
                    continue
                if parts[0] != key:
                    if key is not None:
                        yield f"{path}:{key}", image, label
                    key, image, label = parts[0], None, None
                if parts[1] == "cls" or (parts[1] in IMAGE_KEYS and image is None):
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    image, label = (image, data) if parts[1] == "cls" else (data, label)
    except FileNotFoundError:
        raise DataError(f"shard {path} does not exist") from None
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"shard {path} is not a readable tar file ({err})") from None
    if key is not None:
        yield f"{path}:{key}", image, label


def _decode(raw: Raw, in_chans: int) -> tuple[Any, int]:
    """(PIL image, class index) of a sample; CorruptImageError says why it has none."""
    where, image, label = raw
    if image is None:
        raise CorruptImageError(f"cannot read image {where}: the sample has no image member")
    try:
        index = int((label or b"").decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise CorruptImageError(
            f"cannot read image {where}: its .cls member holds no class index"
        ) from None
    return open_image_bytes(image, where, in_chans=in_chans), index


class ShardStream(StreamSource):
    """The samples of a split of tar shards, read in order, decoded by `apply`.

    A part (`part(index, count)`: a torchrun rank) reads its own shards when their number
    divides by `count`, else every `count`-th sample of all (as `datasets`'
    `split_dataset_by_node`). `keep` holds the places (in the shards' order) of the samples
    of this split when a held-out part was cut from the same shards. An unreadable sample,
    or a shard that ends early, is skipped, logged and recorded in `corrupt` (with
    `skip_corrupt`); past `MAX_CORRUPT` of the split, in one process, the run fails."""

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        length: int,
        keep: frozenset[int] | None = None,
        in_chans: int = 3,
        skip_corrupt: bool = True,
    ) -> None:
        self.shards, self.length, self.keep = list(shards), length, keep
        self.in_chans, self.skip_corrupt = in_chans, skip_corrupt
        self.corrupt: dict[str, str] = {}

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        return (item for item in map(self.apply, self.part(0, 1)) if item is not None)

    def part(self, index: int, count: int) -> Iterator[Raw]:
        if len(self.shards) % count == 0:
            return self._read(self.shards[index::count])
        return itertools.islice(self._read(self.shards), index, None, count)

    def _read(self, shards: Sequence[Shard]) -> Iterator[Raw]:
        for shard in shards:
            read = 0
            try:
                for read, raw in enumerate(_samples(shard.path), 1):
                    if self.keep is None or shard.offset + read - 1 in self.keep:
                        yield raw
            except DataError as err:  # not a tar file, or one that cannot be read on
                self._skip(shard.path, str(err))
                continue
            if read < shard.length:  # cut short: tarfile's stream ends at the damage
                self._skip(shard.path, f"it ends after {read} of its {shard.length} samples")

    def apply(self, item: Raw) -> tuple[Any, int] | None:
        try:
            return _decode(item, self.in_chans)
        except CorruptImageError as err:
            self._skip(item[0], str(err).removeprefix(f"cannot read image {item[0]}: "))
            return None

    def _skip(self, where: str, reason: str) -> None:
        if not self.skip_corrupt:
            raise DataError(f"{where}: {reason}; drop --strict to skip unreadable samples")
        log.warning("skipping %s: %s", where, reason)
        self.corrupt[where] = reason
        if len(self.corrupt) > MAX_CORRUPT * self.length:
            raise DataError(
                f"{len(self.corrupt)} of the {self.length} samples of these shards are "
                f"unreadable (more than {MAX_CORRUPT:.0%}), the first {where} ({reason}); "
                "check the shards (vitkit shards rewrites them from the image folder)"
            )


# -- a source -------------------------------------------------------------------------------


def _count(path: str) -> tuple[int, set[int]]:
    """A shard's samples and the class indices of its `.cls` members (the images are read
    past, not decoded)."""
    count, labels = 0, set()
    for _, _, label in _samples(path):
        count += 1
        try:
            labels.add(int((label or b"").decode().strip()))
        except (UnicodeDecodeError, ValueError):
            pass  # the reader skips the sample
    return count, labels


def _shards(files: Sequence[str], lengths: dict[str, int]) -> tuple[list[Shard], set[int]]:
    """Shards of `files` with their lengths (the info file's, else counted) and the labels
    counting met."""
    shards, labels, offset = [], set(), 0
    for file in files:
        length = lengths.get(Path(file).name)
        if length is None:
            length, found = _count(file)
            labels |= found
        shards.append(Shard(file, length, offset))
        offset += length
    return shards, labels


def load_shards(
    path: str | None,
    *,
    val_fraction: float = VAL_FRACTION,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    in_chans: int = 3,
    skip_corrupt: bool = True,
    **_: Any,
) -> Splits:
    """`wds:PATTERN`: the shards of PATTERN (a brace pattern) for training; val and test from
    the info file's `validation` / `test` splits, else cut from the training shards by place
    (`--val-fraction`, `--test-fraction`, `--seed`)."""
    if not path:
        raise DataError("wds: name the shards, e.g. --data 'wds:shards/train-{0000..0127}.tar'")
    files = expand_pattern(path)
    if len(files) == 1 and Path(files[0]).is_dir():
        raise DataError(
            f"{path} is a folder; name its shards with a brace pattern, e.g. --data "
            f"'wds:{Path(path) / 'train-{0000..0009}.tar'}'"
        )
    missing = [file for file in files if not Path(file).is_file()]
    if missing and os.path.exists(missing[0]):  # a folder, FIFO or device: never opened
        kind = file_kind(os.stat(missing[0]).st_mode)
        raise DataError(f"shard {missing[0]} is {kind}, not a tar file; name the shard files")
    if missing:
        raise DataError(
            f"shard {missing[0]} does not exist ({len(missing)} of the {len(files)} shards of "
            f"{path} are missing); write shards with vitkit shards FOLDER PATTERN"
        )
    folder = Path(files[0]).parent
    info = read_info(folder)
    lengths = _info_lengths(info)
    taken = {Path(file).name for file in files}
    held = {
        "val": [str(folder / f) for f in _named_split(info, VAL_SPLITS, taken)],
        "test": [str(folder / f) for f in _named_split(info, TEST_SPLITS, taken)],
    }
    if any(Path(file).name not in lengths for file in files):
        log.info("no sample counts for %s in an info file: counting them", path)
    shards, labels = _shards(files, lengths)
    total = sum(shard.length for shard in shards)
    if total == 0:
        raise DataError(
            f"the shards of {path} hold no samples; write shards with vitkit shards FOLDER PATTERN"
        )
    opts = {"in_chans": in_chans, "skip_corrupt": skip_corrupt}
    cut = [0.0 if held[name] else f for name, f in (("val", val_fraction), ("test", test_fraction))]
    places = split_indices(total, cut, seed)
    parts = {}
    for name, keep in zip(("train", "val", "test"), places):
        if name != "train" and held[name]:
            own, found = _shards(held[name], lengths)
            labels |= found
            parts[name] = ShardStream(own, length=sum(s.length for s in own), **opts)
        else:
            whole = len(keep) == total
            parts[name] = ShardStream(
                shards, length=len(keep), keep=None if whole else frozenset(keep), **opts
            )
    classes = info.get("classes") or _class_names(labels, shards)
    log.info(
        "shards %s: %s", path, ", ".join(f"{n} {image_count(len(s))}" for n, s in parts.items())
    )
    return Splits(
        **parts,
        class_names=[str(name) for name in classes],
        in_chans=in_chans,
        img_size=None,
        mean=(0.5,) * in_chans,
        std=(0.5,) * in_chans,
        name=path,
    )


def _class_names(labels: set[int], shards: Sequence[Shard]) -> list[str]:
    """'0'..'N-1' for the largest class index met; read from the shards when not counted."""
    if not labels:
        for shard in shards:
            labels |= _count(shard.path)[1]
    if not labels:
        raise DataError(
            f"the shards {shards[0].path}... hold no .cls members; each sample needs its class "
            "index in KEY.cls (vitkit shards writes it)"
        )
    return [str(i) for i in range(max(labels) + 1)]


def first_images(pattern: str, limit: int) -> tuple[list[bytes], int]:
    """The image bytes of the first `limit` samples of the shards of `pattern` (for a look at
    their sizes), and how many samples the shards hold (the info file's, else those read)."""
    files = [file for file in expand_pattern(pattern) if Path(file).is_file()]
    images: list[bytes] = []
    samples = (raw for file in files for raw in _samples(file))
    for _, image, _ in itertools.islice(samples, limit):
        if image is not None:
            images.append(image)
    lengths = _info_lengths(read_info(Path(files[0]).parent)) if files else {}
    known = [lengths.get(Path(file).name) for file in files]
    return images, sum(known) if files and None not in known else len(images)  # type: ignore


# -- writing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrittenShards:
    """What `write_shards` wrote: the shard files, their brace pattern, the info file and the
    split's images and classes."""

    files: list[Path]
    pattern: str
    info: Path
    images: int
    classes: list[str]


def write_shards(
    folder: str | os.PathLike,
    pattern: str,
    *,
    per_shard: int = 1000,
    split: str = "train",
    seed: int = 0,
    overwrite: bool = False,
    on_shard: Callable[[int, int], None] | None = None,
) -> WrittenShards:
    """The images of an image folder (`folder/<class>/<image>`) as tar shards of `per_shard`
    samples, in a seeded random order (a training stream is shuffled only through a buffer),
    named by `pattern` (`shards/train-%04d.tar`, as webdataset's `ShardWriter`), and the
    split in the info file beside them (its other splits kept). The files' bytes are copied,
    not decoded. Each file is written atomically; a path that is not a regular file is
    refused, and so is a shard file that exists unless `overwrite`.

    Args:
        folder: class folders of images.
        pattern: the shard paths, with one `%d` field (e.g. `%04d`) for the shard's number.
        per_shard: samples a shard holds.
        split: the split's name in the info file (train, validation, test).
        seed: the order of the samples.
        overwrite: replace shard files that exist (else a DataError names the first).
        on_shard: called with (shards written, shards in all) after each (a progress bar).
    """
    if per_shard < 1:
        raise ValueError(f"per_shard {per_shard} must be >= 1")
    if not split.strip():
        raise ValueError("the split's name is empty; name it train, validation or test")
    names = _shard_names(pattern, 2)
    layout = folder_layout(folder)
    if layout.parts:
        first = next(iter(layout.parts.values()))
        raise DataError(
            f"{folder} is split into {', '.join(p.name + '/' for p in layout.parts.values())}; "
            f"write each split on its own, e.g. vitkit shards {first} PATTERN --split "
            f"{next(iter(layout.parts))}"
        )
    out = Path(names[0]).parent
    info = read_info(out)
    classes, samples = class_folders(layout.root, info.get("classes"), str(out / INFO_FILES[0]))
    random.Random(seed).shuffle(samples)
    count = -(-len(samples) // per_shard)
    files = [Path(name) for name in _shard_names(pattern, count)]
    for file in files:  # a FIFO, folder or device is refused before any shard is written
        check_output(file)
    existing = [file for file in files if file.exists() or file.is_symlink()]
    if existing and not overwrite:
        raise DataError(
            f"{existing[0]} exists ({len(existing)} of the {count} shard files); pass "
            "--overwrite to replace them, or choose another OUT_PATTERN"
        )
    for number, file in enumerate(files):
        chunk = samples[number * per_shard : (number + 1) * per_shard]
        atomic_write(file, lambda f, c=chunk, n=number: _write_tar(f, c, n * per_shard))
        if on_shard is not None:
            on_shard(number + 1, count)
    lengths = [len(samples[i * per_shard : (i + 1) * per_shard]) for i in range(count)]
    entry = {
        "name": split,
        "num_samples": len(samples),
        "filenames": [f.name for f in files],
        "shard_lengths": lengths,
    }
    splits = {**info.get("splits", {}), split: entry}
    info = {"name": layout.root.name, **info, "splits": splits, "classes": classes}
    atomic_write(out / INFO_FILES[0], lambda f: f.write(json.dumps(info, indent=1)), "w")
    return WrittenShards(files, _brace(pattern, count), out / INFO_FILES[0], len(samples), classes)


def _shard_names(pattern: str, count: int) -> list[str]:
    try:
        names = [pattern % number for number in range(count)]
    except (TypeError, ValueError):
        names = []
    if len(set(names)) != count or count == 0:
        raise ValueError(
            f"shard pattern {pattern!r} needs one number field such as %04d for the shard's "
            "number, e.g. shards/train-%04d.tar"
        )
    return names


def _brace(pattern: str, count: int) -> str:
    """`shards/train-%04d.tar` and 3 shards -> `shards/train-{0000..0002}.tar`."""
    if count == 1:
        return pattern % 0
    field = re.search(r"%0?\d*d", pattern)
    assert field is not None  # _shard_names checked it
    span = "{" + f"{field.group(0) % 0}..{field.group(0) % (count - 1)}" + "}"
    return pattern[: field.start()] + span + pattern[field.end() :]


def _write_tar(file: Any, samples: Sequence[tuple[str, int]], first: int) -> None:
    """`samples` as a tar of `KEY.<ext>` and `KEY.cls` members (keys numbered from `first`),
    with fixed owners and times, so the same folder gives the same bytes."""
    with tarfile.open(fileobj=file, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number, (path, label) in enumerate(samples, first):
            key = f"{number:08d}"
            ext = Path(path).suffix.lower()
            try:
                data = Path(path).read_bytes()
            except OSError as err:
                raise DataError(f"cannot read {path} ({err.strerror or err})") from None
            for name, content in ((key + ext, data), (f"{key}.cls", str(label).encode())):
                member = tarfile.TarInfo(name)
                member.size, member.mode = len(content), 0o644
                tar.addfile(member, io.BytesIO(content))
