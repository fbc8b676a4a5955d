"""Datasets: images in memory or in files, subsets, transforms, and the seeded splits."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset

from .images import CorruptImageError, DataError, NeededSize, open_image, read_image

log = logging.getLogger(__name__)


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
    """Image files decoded with Pillow on access, converted to `in_chans`: tensors squashed to
    `img_size` when it is given (for use without transforms); `load(i, full_resolution=True)`
    gives the PIL image at its own size, which `Transformed` hands to vitkit's transforms.

    With `skip_corrupt=True` an unreadable file yields None (the collate function drops it),
    is logged once and recorded in `self.corrupt` (path -> reason); when every file has
    failed, a DataError names the first few and the count. Otherwise the first raises
    `CorruptImageError` naming the file. (With loader worker processes each worker records its
    own files; `corrupt` here sees those read in this process.) `unreadable` are files already
    known unreadable (a folder survey's, path -> reason): skipped without being read or logged.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        *,
        in_chans: int = 3,
        img_size: tuple[int, int] | None = None,
        skip_corrupt: bool = False,
        unreadable: Mapping[str, str] | None = None,
    ) -> None:
        self.samples = list(samples)
        self.in_chans = in_chans
        self.img_size = img_size
        self.skip_corrupt = skip_corrupt
        self.corrupt: dict[str, str] = dict(unreadable or {})
        self._distinct = len({path for path, _ in self.samples})

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | None:
        return self.load(index)

    def load(
        self, index: int, *, full_resolution: bool = False, needed: NeededSize | None = None
    ) -> tuple[Any, int] | None:
        """(image, label): a tensor as `__getitem__`, or with `full_resolution` the PIL image
        ('RGB' / 'L', 8-bit) at its own size, or a `ReducedImage` where `needed` allows (see
        `open_image`); None for a skipped file."""
        path, label = self.samples[index]
        if path in self.corrupt:
            return None
        try:
            if full_resolution:
                image = open_image(path, in_chans=self.in_chans, needed=needed)
            else:
                image = read_image(path, in_chans=self.in_chans, size=self.img_size)
        except CorruptImageError as err:
            if not self.skip_corrupt:
                raise
            reason = str(err).removeprefix(f"cannot read image {path}: ")
            log.warning("skipping an unreadable image: %s (%s)", path, reason)
            self.corrupt[path] = reason
            if len(self.corrupt) == self._distinct:
                raise DataError(none_readable(self.corrupt)) from None
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
    """Apply `transform` to each image (None items, i.e. skipped files, pass through).

    A transform with `full_resolution = True` (vitkit's, which size images themselves) gets
    image files as PIL images at their own size, not squashed at decode; large JPEGs reduced
    as far as its `decode_size` allows.
    """

    def __init__(self, dataset: Dataset, transform: Callable[[Tensor], Tensor] | None) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | None:
        if getattr(self.transform, "full_resolution", False):
            needed = getattr(self.transform, "decode_size", None)
            item = _full_resolution_item(self.dataset, index, needed)
        else:
            item = self.dataset[index]
        if item is None or self.transform is None:
            return item
        return self.transform(item[0]), item[1]


class SeededItems(Dataset):
    """`dataset` with each item's random draws seeded from (seed, epoch, index) alone.

    Training transforms draw from torch's and Python's global generators (vitkit's from one
    `random.Random` per image, seeded from torch's). Seeding both before each item makes an
    image's augmentation independent of which loader worker reads it, in what order, and of
    where a resumed epoch starts; their states are restored after each item, so the main
    process's own stream (Mixup, CutMix, drop path, which `state.pt` restores) is the same
    with or without workers. NumPy's global generator is left alone (vitkit draws nothing from
    it, and saving and restoring it would cost 60 us an item), so draws of a transform of your
    own from it are not repeated this way. `set_epoch` is called before each epoch (the
    loader's workers, started anew each epoch, get a copy at that epoch).
    """

    def __init__(self, dataset: Dataset, *, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        with seeded(item_seed(self.seed, self.epoch, index)):
            return self.dataset[index]


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed of (seed, epoch, index), the same in every process and Python version."""
    digest = hashlib.blake2b(f"{seed},{epoch},{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's CPU and Python's global generators seeded with `seed` inside, their previous
    states back afterwards (a CUDA generator is not touched)."""
    cpu = torch.random.default_generator
    torch_state, python_state = cpu.get_state(), random.getstate()
    cpu.manual_seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        cpu.set_state(torch_state)
        random.setstate(python_state)


def _full_resolution_item(dataset: Dataset, index: int, needed: NeededSize | None) -> Any:
    """`dataset[index]`, image files not squashed (through Subset wrappers)."""
    while isinstance(dataset, Subset):
        dataset, index = dataset.dataset, dataset.indices[index]
    if isinstance(dataset, ImageFiles):
        return dataset.load(index, full_resolution=True, needed=needed)
    return dataset[index]


def corrupt_count(dataset: Dataset) -> int:
    """How many files of `dataset` (through Subset / Transformed wrappers) were skipped."""
    return len(unreadable_files(dataset))


def unreadable_files(dataset: Dataset) -> dict[str, str]:
    """The files of `dataset` skipped as unreadable so far, path -> reason, in the order met
    (through Subset / Transformed / ConcatDataset wrappers)."""
    if isinstance(getattr(dataset, "corrupt", None), dict):  # image files, a reader of shards
        return dict(dataset.corrupt)
    if isinstance(dataset, ConcatDataset):
        return {k: v for part in dataset.datasets for k, v in unreadable_files(part).items()}
    inner = getattr(dataset, "dataset", None)
    return {} if inner is None else unreadable_files(inner)


def none_readable(corrupt: dict[str, str], shown: int = 3) -> str:
    """The error of a set of images none of which could be read: the first few and the count."""
    if len(corrupt) == 1:
        [(path, reason)] = corrupt.items()
        return (
            f"cannot read the image {path}: {reason}; check that it is an image file (open it "
            "in an image viewer)"
        )
    first = "; ".join(f"{path} ({reason})" for path, reason in list(corrupt.items())[:shown])
    more = f"; and {len(corrupt) - shown} more" if len(corrupt) > shown else ""
    count = "the image" if len(corrupt) == 1 else f"any of the {len(corrupt)} images"
    return (
        f"cannot read {count}: {first}{more}; check that these are image files (open one in "
        "an image viewer) or point --data at the right folder"
    )


def collate(batch: list[tuple[Tensor, int | Tensor] | None]) -> tuple[Tensor, Tensor]:
    """Stack (image, label) pairs, dropping the None of skipped files; multi-hot targets
    (multi-label data) stack to (B, num_classes)."""
    items = [item for item in batch if item is not None]
    if not items:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    images = torch.stack([image for image, _ in items])  # (B, C, H, W)
    if isinstance(items[0][1], Tensor):
        return images, torch.stack([label for _, label in items])  # (B, num_classes)
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return images, labels


# -- splitting ------------------------------------------------------------------------------


# The shares of the data held out for validation and for testing where a source has no
# ready-made parts: stated here once, for the loaders, the training jobs' options and the
# checkpoint's record of its split (`weights.checkpoint.RunMeta`).
VAL_FRACTION = 0.1
TEST_FRACTION = 0.2


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


def mean_std(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = images.float() / (255.0 if images.dtype == torch.uint8 else 1.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return tuple(round(v, 4) for v in mean.tolist()), tuple(round(v, 4) for v in std.tolist())
