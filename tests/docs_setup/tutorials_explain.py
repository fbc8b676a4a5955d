"""Files the explain tutorial assumes: `seven.png`, the last 7 of scikit-learn's digits (in
the test split of `vitkit train`'s default data) saved at 32x32."""

from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits


def setup(folder: Path) -> None:
    digits = load_digits()
    seven = digits.images[np.flatnonzero(digits.target == 7)[-1]]
    image = Image.fromarray((seven * 255 / 16).astype("uint8")).resize((32, 32))
    image.save(folder / "seven.png")
