"""Image files read into tensors: one decoder for training, evaluation and prediction.

Every image comes back as a float tensor (C, H, W) in [0, 1]; the transforms in `augment.py`
normalise and augment it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch
from torch import Tensor

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")
# Pillow's convert("L"/"RGB") clips these to 255 instead of scaling: they are read as 16-bit.
_WIDE_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class DataError(ValueError):
    """Data that cannot be used (missing, empty, unreadable), with the fix in the message."""


class CorruptImageError(DataError):
    """An image file Pillow cannot decode."""


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
