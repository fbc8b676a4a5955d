"""Image files decoded: one decoder for training, evaluation and prediction.

`open_image` gives the PIL image the transforms take (8-bit 'RGB' or 'L', as timm's loader
gives them), `read_image` a float tensor (C, H, W) in [0, 1]. Both apply the EXIF orientation
(a phone photo stored sideways is seen upright) and convert every PIL mode by its meaning:
16-bit grey is scaled from 0..65535, not clipped at 255 as Pillow's `convert` does; 32-bit
integer ('I') and float ('F') pixels are read when their values lie in a known range and are
refused, naming the mode and the values, when they do not.

A JPEG much larger than a transform needs can be decoded smaller: libjpeg scales the DCT by
1/2, 1/4 or 1/8 while decoding (`Image.draft`), which costs a fraction of a full decode. The
transform says the least size it needs (`needed`, e.g. `Compose.decode_size`); the decoder
takes the largest reduction that still gives at least that many pixels on each side, and hands
back a `ReducedImage` that keeps the full image's geometry, so crops and resizes land on the
same places (docs/guides/images.md, "Decoding large JPEGs", has the measured difference).
"""

from __future__ import annotations

import glob
import io
import logging
import os
import re
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError
from torch import Tensor

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")
_16_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
# EXIF orientation -> (stored x reversed, stored y reversed, axes swapped) once upright, as
# `ImageOps.exif_transpose` turns the image (2: mirror, 6: rotate 90 clockwise, ...)
_ORIENTATIONS = {
    1: (False, False, False),
    2: (True, False, False),
    3: (True, True, False),
    4: (False, True, False),
    5: (False, False, True),
    6: (False, True, True),
    7: (True, True, True),
    8: (True, False, True),
}
NeededSize = Callable[[int, int], "tuple[int, int] | None"]


class DataError(ValueError):
    """Data that cannot be used (missing, empty, unreadable), with the fix in the message."""


class CorruptImageError(DataError):
    """An image file Pillow cannot decode, or whose pixels have no known meaning."""


def _grey_float(img: Image.Image) -> np.ndarray | str:
    """16- and 32-bit grey pixels scaled to [0, 1] (float32 (H, W)), or why they cannot be."""
    if img.mode in _16_BIT_MODES:
        return np.asarray(img, dtype=np.float32) / 65535.0
    values = np.asarray(img)
    if img.mode == "F":
        if np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1:
            return values.astype(np.float32)
        low, high = np.nanmin(values), np.nanmax(values)
        return (
            f"its 32-bit float pixels (PIL mode F) run from {low:g} to {high:g}, outside [0, 1]; "
            "scale them to [0, 1] or save the image as 8- or 16-bit"
        )
    # 'I': 32-bit signed ints; 16-bit PNGs and TIFFs are often opened in this mode
    if values.size == 0 or (values.min() >= 0 and values.max() <= 65535):
        return values.astype(np.float32) / 65535.0
    return (
        f"its 32-bit integer pixels (PIL mode I) run from {values.min()} to {values.max()}, "
        "outside the 16-bit range 0..65535 vitkit reads them in; save the image as 8- or 16-bit"
    )


@dataclass(frozen=True)
class ReducedImage:
    """A JPEG decoded by libjpeg at 1/2, 1/4 or 1/8 of its size (`Image.draft`).

    `image` is the decoded 8-bit 'RGB' / 'L' image, upright; `size` (h, w) the full upright
    image's; `box` (left, top, right, bottom) the full image's extent in `image`'s pixels
    (`image` can be a fraction of a pixel larger: libjpeg decodes the last, partial 8x8 block
    whole). Transforms crop and resize through `region`, in the full image's coordinates."""

    image: Image.Image
    size: tuple[int, int]
    box: tuple[float, float, float, float]

    @property
    def scale(self) -> int:
        """The reduction: 2, 4 or 8."""
        return round(self.size[1] / (self.box[2] - self.box[0]))

    def region(
        self, top: float, left: float, height: float, width: float
    ) -> tuple[float, float, float, float]:
        """The box (left, top, right, bottom) in `image` of the full image's region."""
        x0, y0, x1, y1 = self.box
        sx, sy = (x1 - x0) / self.size[1], (y1 - y0) / self.size[0]
        return x0 + left * sx, y0 + top * sy, x0 + (left + width) * sx, y0 + (top + height) * sy


def _draft(img: Image.Image, needed: NeededSize) -> tuple[tuple[int, int], tuple] | None:
    """Ask libjpeg to decode `img` (opened, not loaded) at the largest reduction that keeps at
    least `needed(h, w)` pixels of the upright image on each side: the full upright size and
    the full image's box in the upright reduced image, or None when it is not reduced (not
    a JPEG, or not large enough for 1/2)."""
    orientation = img.getexif().get(ExifTags.Base.Orientation, 1)
    flip_x, flip_y, swap = _ORIENTATIONS.get(orientation, _ORIENTATIONS[1])
    width, height = img.size  # as stored
    upright = (width, height) if swap else (height, width)
    want = needed(*upright)
    if want is None:
        return None
    want_w, want_h = (want[0], want[1]) if swap else (want[1], want[0])  # as stored
    if width // max(want_w, 1) < 2 or height // max(want_h, 1) < 2:
        return None
    drafted = img.draft(None, (want_w, want_h))  # None for formats without reduced decoding
    if drafted is None or drafted[1][2] >= width:
        return None
    _, (_, _, extent_w, extent_h) = drafted
    left = img.size[0] - extent_w if flip_x else 0.0
    top = img.size[1] - extent_h if flip_y else 0.0
    box = (left, top, left + extent_w, top + extent_h)  # as stored
    return upright, (box[1], box[0], box[3], box[2]) if swap else box


def _decode(
    path: str | os.PathLike, in_chans: int, needed: NeededSize | None = None
) -> Image.Image | ReducedImage:
    """The file upright as 'L' / 'RGB' (8-bit) or 'F' (wide grey in [0, 1]), at full
    resolution or, with `needed`, reduced where it can be; errors name the file."""
    if in_chans not in (1, 3):
        raise ValueError(f"images are read with 1 or 3 channels, not {in_chans}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                reduced = None if needed is None else _draft(img, needed)
                decoded = _convert(img, path, in_chans)
                return decoded if reduced is None else ReducedImage(decoded, *reduced)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise CorruptImageError(
            f"cannot read image {path}: {err} Raise PIL.Image.MAX_IMAGE_PIXELS if you trust it"
        ) from None
    except CorruptImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise CorruptImageError(f"cannot read image {path}: {pil_reason(err, path)}") from None


# Threads reading image headers: the reads wait on the disk more than on Python (8 threads
# read 1,000 cached 224x224 files 1.6x faster than one, on 2 cores).
HEADER_THREADS = 8


def unreadable_images(paths: Sequence[str]) -> dict[str, str]:
    """The files Pillow cannot identify from their header, path -> why, in `paths` order.

    Only the header is read (`Image.open`: ~0.1 ms a file), not the pixels: `verify()` reads
    the whole file (2-3x the time, and for JPEG checks nothing more), so a file cut short in
    its pixel data is still found by the loader when it is decoded."""
    with ThreadPoolExecutor(HEADER_THREADS) as pool:
        reasons = list(pool.map(_header_problem, paths, chunksize=64))
    return {path: why for path, why in zip(paths, reasons) if why is not None}


def _header_problem(path: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the loader says
            with Image.open(path):
                return None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        return pil_reason(err, path)
    except Image.DecompressionBombError:
        return None  # readable; the loader names the limit and how to raise it


def pil_reason(err: BaseException, path: Any) -> str:
    """Pillow's reason without the path it repeats ("cannot identify image file 'a.png'") or
    the repr of an in-memory file: vitkit's line names the file once."""
    if not isinstance(path, (str, os.PathLike)):
        return re.sub(r" ?<[\w.]+ object at 0x[0-9a-f]+>", "", str(err))
    return str(err).replace(f" {str(path)!r}", "").replace(f" {os.fspath(path)!r}", "")


def _convert(img: Image.Image, path: str | os.PathLike, in_chans: int) -> Image.Image:
    """The opened file decoded, upright, in the mode `_decode` gives."""
    target = "L" if in_chans == 1 else "RGB"
    img = ImageOps.exif_transpose(img)
    if img.mode in (*_16_BIT_MODES, "I", "F"):
        grey = _grey_float(img)
        if isinstance(grey, str):
            raise CorruptImageError(f"cannot read image {path}: {grey}")
        return Image.fromarray(grey)  # float32 -> mode F
    try:
        return img.convert(target)
    except ValueError:  # e.g. LAB converts to RGB only
        pass
    try:
        return img.convert("RGB").convert(target)
    except ValueError:
        raise CorruptImageError(
            f"cannot read image {path}: Pillow cannot convert its mode "
            f"{img.mode} to {target}; save it as RGB or greyscale"
        ) from None


def open_image(
    path: str | os.PathLike, *, in_chans: int = 3, needed: NeededSize | None = None
) -> Image.Image | ReducedImage:
    """An image file as an 8-bit PIL image at full resolution: 'RGB' (in_chans=3) or 'L' (1).

    Grey, palette, RGBA (alpha dropped, as torchvision's loader does), CMYK, YCbCr, HSV and
    16-bit grey (scaled) images are converted; see the module docstring for 32-bit pixels.
    Raises `CorruptImageError` naming the file when it cannot be read, and for images over
    `PIL.Image.MAX_IMAGE_PIXELS` (decompression bombs).

    `needed(height, width)`, given the full upright size, returns the least (h, w) the whole
    image may be decoded at (or None: full size). A JPEG at least twice that on both sides is
    decoded reduced and returned as a `ReducedImage`, which vitkit's transforms take
    (`Compose.decode_size` is such a function); other images come back at full resolution.
    """
    img = _decode(path, in_chans, needed)
    if isinstance(img, ReducedImage) or img.mode != "F":
        return img
    grey = np.rint(np.asarray(img) * 255.0).astype(np.uint8)
    return Image.fromarray(grey).convert("L" if in_chans == 1 else "RGB")  # uint8 -> mode L


def open_image_bytes(data: bytes, name: str, *, in_chans: int = 3) -> Image.Image:
    """An image held in memory (a tar member, a table's cell) as `open_image` gives a file;
    its errors name it `name` (e.g. 'shard.tar:000017')."""
    try:
        return open_image(io.BytesIO(data), in_chans=in_chans)  # type: ignore[return-value]
    except CorruptImageError as err:
        reason = str(err).split(": ", 1)[-1]  # pil_reason left out the in-memory file's repr
        raise CorruptImageError(f"cannot read image {name}: {reason}") from None


def read_image(
    path: str | os.PathLike, *, in_chans: int = 3, size: tuple[int, int] | None = None
) -> Tensor:
    """An image file as a float tensor (in_chans, H, W) in [0, 1], squashed to `size` (h, w)
    with a bilinear filter when given; 16-bit grey keeps its precision. Errors as
    `open_image`."""
    img = _decode(path, in_chans)
    if size is not None and img.size != (size[1], size[0]):
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    if img.mode != "F":
        return image_to_tensor(img)
    grey = torch.from_numpy(np.asarray(img, dtype=np.float32).clip(0.0, 1.0))  # (H, W)
    return grey.expand(in_chans, *grey.shape).clone()  # (C, H, W)


def image_to_tensor(img: Image.Image) -> Tensor:
    """An 8-bit 'L' or 'RGB' PIL image -> float (C, H, W) in [0, 1] (torchvision's to_tensor)."""
    array = np.asarray(img, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(255)  # (C, H, W)


def tensor_to_image(x: Tensor) -> Image.Image:
    """A float (C, H, W) tensor in [0, 1] with 1 or 3 channels -> an 8-bit 'L' / 'RGB' image
    (rounded, so an image that came from 8 bits comes back unchanged)."""
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise ValueError(
            f"PIL-based transforms take (C, H, W) tensors with 1 or 3 channels, got "
            f"{tuple(x.shape)}; turn RandAugment off (aa none) for other images"
        )
    array = (x.detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8)
    array = array.permute(1, 2, 0).numpy()  # (H, W, C)
    return Image.fromarray(array[:, :, 0] if x.shape[0] == 1 else array)  # 'L' or 'RGB'


# -- many files: what predict and explain take ---------------------------------------------


def find_images(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Image files from files, folders (searched recursively) and glob patterns ('*.jpg',
    'photos/**/*.png'), in the order given, each folder's or pattern's matches sorted, each
    file once.

    A file named outright is taken whatever its name (decoding says whether it is an image);
    in folders and pattern matches, files with an image extension (`IMAGE_EXTENSIONS`, any
    case) outside hidden folders. A DataError names an input that yields no image.
    """
    found: dict[Path, None] = {}
    for item in inputs:
        path = Path(item)
        if path.is_file():
            matches = [path]
        elif path.is_dir():
            matches = _images_under(path)
            if not matches:
                raise DataError(
                    f"folder {path} holds no images (searched recursively for "
                    f"{', '.join(IMAGE_EXTENSIONS)})"
                )
        elif any(c in str(item) for c in "*?["):
            matches = []
            for hit in map(Path, sorted(glob.glob(str(item), recursive=True))):
                matches += _images_under(hit) if hit.is_dir() else [hit] * _is_image_name(hit)
            if not matches:
                raise DataError(f"{item} matches no image file")
        else:
            raise DataError(f"image {path} does not exist")
        found.update(dict.fromkeys(matches))
    if not found:
        raise DataError("no images given; name image files, folders or patterns such as *.jpg")
    return list(found)


def _is_image_name(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def _images_under(folder: Path) -> list[Path]:
    return [
        file
        for file in sorted(folder.rglob("*"))
        if _is_image_name(file)
        and not any(part.startswith(".") for part in file.relative_to(folder).parts)
    ]


@dataclass(frozen=True)
class LoadedImages:
    """Image files decoded and prepared: `images` (N, C, H, W) for the readable `paths` (in
    order), and the `skipped` ones, path -> why they could not be read."""

    images: Tensor
    paths: list[str]
    skipped: dict[str, str] = field(default_factory=dict)


def load_images(
    paths: Sequence[str | os.PathLike],
    transform: Callable[[Image.Image], Tensor],
    *,
    in_chans: int = 3,
) -> LoadedImages:
    """Decode each file (`open_image`; reduced where `transform.decode_size` allows) and
    prepare it with `transform` (e.g. `eval_transform(data_config)`); a file that cannot be
    read is skipped and named in `skipped` with the reason (the caller reports them, once), so
    one bad file does not stop the others. With none readable, `images` is empty (0,) and the
    caller says so (`datasets.none_readable`)."""
    images, kept, skipped = [], [], {}
    for path in map(str, paths):
        try:
            needed = getattr(transform, "decode_size", None)
            images.append(transform(open_image(path, in_chans=in_chans, needed=needed)))
        except DataError as err:  # unreadable, or gone since it was listed
            reason = str(err).removeprefix(f"cannot read image {path}: ")
            skipped[path] = "it does not exist" if reason.endswith("does not exist") else reason
            log.debug("skipping %s", err)  # the caller names them all in one line
            continue
        kept.append(path)
    stacked = torch.stack(images) if images else torch.empty(0)  # (N, C, H, W)
    return LoadedImages(stacked, kept, skipped)
