"""Files the evaluate-and-predict guide assumes: `heldout/`, a folder of labelled digit images
(one sub-folder per class, 4 images each), `seven.png`, a 7 from the digits' test split saved
at 32x32, and `photos/`, a few digits with one file that is not an image."""

from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits


def _png(image: np.ndarray, size: int = 32) -> Image.Image:
    return Image.fromarray((image * 255 / 16).astype("uint8")).resize((size, size))


def setup(folder: Path) -> None:
    digits = load_digits()
    # The last 400 digits: the held-out folder takes 4 of each class from them.
    counts = dict.fromkeys(range(10), 0)
    for image, label in zip(digits.images[-400:], digits.target[-400:]):
        label = int(label)
        if counts[label] < 4:
            counts[label] += 1
            path = folder / "heldout" / str(label) / f"{label}_{counts[label]}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            _png(image).save(path)
    sevens = np.flatnonzero(digits.target == 7)
    _png(digits.images[sevens[-1]]).save(folder / "seven.png")
    photos = folder / "photos"
    photos.mkdir()
    for i in range(3):
        _png(digits.images[i]).save(photos / f"digit_{i}.png")
    (photos / "notes.png").write_text("not an image\n")
