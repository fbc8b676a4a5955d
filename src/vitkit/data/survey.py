"""A cheap look at a data source's images: how many, how large, greyscale or colour.

What a run's default model is sized to (`train.recipes.default_choice`). An image folder is
looked at through at most `SAMPLE` of its images, spread over the classes, each opened lazily:
Pillow reads the header (size, mode, EXIF orientation), never the pixels; tar shards through
their first `SAMPLE` images (written in a shuffled order), a Hugging Face dataset through the
first `SAMPLE` of its `Image` column. A CIFAR archive is
32x32 RGB by its format, so nothing of it is read.
"""

from __future__ import annotations

import io
import os
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from .file_lists import read_list
from .folders import SPLIT_FOLDERS, Samples, class_folders
from .hf_datasets import first_images as hf_first_images
from .shards import first_images

# Headers read per folder: 200 put the median within a few percent for a folder of mixed
# sizes, at well under a second (a header is a few kB).
SAMPLE = 200
# PIL modes with one colour channel (alpha aside): 1-bit, 8-, 16-, 32-bit and float grey.
GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})
# EXIF orientations that turn the image a quarter (the loader sees it upright, H and W swapped).
_QUARTER_TURNS = frozenset({5, 6, 7, 8})


@dataclass(frozen=True)
class ImageSurvey:
    """What a look at a source's images found.

    Args:
        size: the median (height, width) of the images read.
        grey: the images read have one colour channel each.
        colour: 'RGB', 'greyscale', or 'RGB and greyscale' (a mix: read as RGB).
        count: the images the source holds (None: not counted, as for CIFAR).
        read: how many headers were read (0: known from the format).
        kind: what the source is when that says more than the count ('CIFAR').
    """

    size: tuple[int, int]
    grey: bool
    colour: str
    count: int | None = None
    read: int = 0
    kind: str = ""

    @property
    def in_chans(self) -> int:
        """The channels a model for these images takes: 1 when all are greyscale, else 3."""
        return 1 if self.grey else 3

    @property
    def short_side(self) -> int:
        return min(self.size)

    def describe(self) -> str:
        """'340 RGB images, median 480x360' (width x height, as image sizes are written)."""
        height, width = self.size
        if self.kind:
            return f"{self.kind}, {width}x{height} {self.colour} images"
        if self.count is None:  # a stream, not counted
            return f"{self.colour} images, median {width}x{height} of the first {self.read}"
        images = "image" if self.count == 1 else "images"
        text = f"{self.count} {self.colour} {images}, median {width}x{height}"
        return text if self.read == self.count else f"{text} of {self.read} read"


def survey_images(kind: str, path: str | os.PathLike | None) -> ImageSurvey | None:
    """A look at the images of a source (`detect_source`'s kind and path): an image folder's
    (or a file list's) sampled headers, CIFAR's format. None when there is nothing to go by:
    a source whose images are not looked at (in memory), or a folder none of whose sampled
    images opens (the loader names the broken files). A folder or list that cannot be used
    (no classes, no images) raises the loader's DataError."""
    if kind == "cifar":
        return ImageSurvey(size=(32, 32), grey=False, colour="RGB", kind="CIFAR")
    if kind in ("hfds", "hfids") and path is not None:
        images, count = hf_first_images(path, SAMPLE, streaming=kind == "hfids")
        return _surveyed(images, count)
    if kind == "wds" and path is not None:
        images, count = first_images(path, SAMPLE)  # a shuffled stream: its first images
        return _surveyed([io.BytesIO(image) for image in images], count)
    if kind == "list" and path is not None:  # a file list: the images it names
        samples = [(entry.path, 0) for entry in read_list(path)]
    elif kind != "folder" or path is None:
        return None
    else:
        root = Path(path)
        train = next((root / n for n in SPLIT_FOLDERS["train"] if (root / n).is_dir()), root)
        _, samples = class_folders(train)
    return _surveyed(_spread(samples, SAMPLE), len(samples))


def _surveyed(picked: list[Any], count: int | None) -> ImageSurvey | None:
    """What the headers of the `picked` files say of a source of `count` images."""
    headers, failed = [], 0
    for file in picked:
        try:
            headers.append(_header(file))
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            failed += 1  # the loader names it, and leaves it out as this count does
    if not headers:
        return None
    modes = {mode in GREY_MODES for mode, _ in headers}
    colour = {frozenset({True}): "greyscale", frozenset({False}): "RGB"}.get(
        frozenset(modes), "RGB and greyscale"
    )
    heights = [h for _, (h, _) in headers]
    widths = [w for _, (_, w) in headers]
    size = (statistics.median_low(heights), statistics.median_low(widths))
    return ImageSurvey(
        size=size,
        grey=modes == {True},
        colour=colour,
        count=None if count is None else count - failed,
        read=len(headers),
    )


def _spread(samples: Samples, limit: int) -> list[str]:
    """At most `limit` files, evenly spaced within each class, as many from each class (from
    `limit` classes evenly spaced when there are more)."""
    groups: dict[int, list[str]] = {}
    for file, label in samples:
        groups.setdefault(label, []).append(file)
    files = list(groups.values())
    if len(files) > limit:
        files = [files[i * len(files) // limit] for i in range(limit)]
    per = max(1, limit // len(files))
    picked = []
    for group in files:
        n = min(per, len(group))
        picked += [group[i * len(group) // n] for i in range(n)]
    return picked


def _header(file: Any) -> tuple[str, tuple[int, int]]:
    """(PIL mode, (height, width) as the loader sees it upright), from the file's header."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the loader says so
        with Image.open(file) as img:
            width, height = img.size
            # Image's own getexif reads what the header holds (PNG's decodes the pixels to
            # look for an eXIf chunk after them); 0x0112 is the EXIF orientation.
            if Image.Image.getexif(img).get(0x0112) in _QUARTER_TURNS:
                width, height = height, width
            return img.mode, (height, width)
