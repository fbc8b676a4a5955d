"""Image files decoded at full resolution: one decoder for training, evaluation and prediction.

`open_image` gives the PIL image the transforms take (8-bit 'RGB' or 'L', as timm's loader
gives them), `read_image` a float tensor (C, H, W) in [0, 1]. Both apply the EXIF orientation
(a phone photo stored sideways is seen upright) and convert every PIL mode by its meaning:
16-bit grey is scaled from 0..65535, not clipped at 255 as Pillow's `convert` does; 32-bit
integer ('I') and float ('F') pixels are read when their values lie in a known range and are
refused, naming the mode and the values, when they do not.
"""

from __future__ import annotations

import glob
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")
_16_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


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


def _decode(path: str | os.PathLike, in_chans: int) -> Image.Image:
    """The file at full resolution, upright, as 'L' / 'RGB' (8-bit) or 'F' (wide grey in
    [0, 1]); errors name the file."""
    if in_chans not in (1, 3):
        raise ValueError(f"images are read with 1 or 3 channels, not {in_chans}")
    target = "L" if in_chans == 1 else "RGB"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
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
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise CorruptImageError(
            f"cannot read image {path}: {err} Raise PIL.Image.MAX_IMAGE_PIXELS if you trust it"
        ) from None
    except CorruptImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise CorruptImageError(f"cannot read image {path}: {err}") from None


def open_image(path: str | os.PathLike, *, in_chans: int = 3) -> Image.Image:
    """An image file as an 8-bit PIL image at full resolution: 'RGB' (in_chans=3) or 'L' (1).

    Grey, palette, RGBA (alpha dropped, as torchvision's loader does), CMYK, YCbCr, HSV and
    16-bit grey (scaled) images are converted; see the module docstring for 32-bit pixels.
    Raises `CorruptImageError` naming the file when it cannot be read, and for images over
    `PIL.Image.MAX_IMAGE_PIXELS` (decompression bombs).
    """
    img = _decode(path, in_chans)
    if img.mode != "F":
        return img
    grey = np.rint(np.asarray(img) * 255.0).astype(np.uint8)
    return Image.fromarray(grey).convert("L" if in_chans == 1 else "RGB")  # uint8 -> mode L


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
    """Decode each file at full resolution (`open_image`) and prepare it with `transform`
    (e.g. `eval_transform(data_config)`); a file that cannot be read is skipped, logged and
    named in `skipped` with the reason, so one bad file does not stop the others. With none
    readable, `images` is empty (0,) and the caller says so (`datasets.none_readable`)."""
    images, kept, skipped = [], [], {}
    for path in map(str, paths):
        try:
            images.append(transform(open_image(path, in_chans=in_chans)))
        except DataError as err:  # unreadable, or gone since it was listed
            reason = str(err).removeprefix(f"cannot read image {path}: ")
            skipped[path] = "it does not exist" if reason.endswith("does not exist") else reason
            log.warning("skipping %s", err)
            continue
        kept.append(path)
    stacked = torch.stack(images) if images else torch.empty(0)  # (N, C, H, W)
    return LoadedImages(stacked, kept, skipped)
