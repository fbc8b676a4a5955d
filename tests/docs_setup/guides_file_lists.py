"""Files the file-list guide assumes: tiny 8x8 PNGs of three colours listed in CSV and JSONL,
a train / val / test set of lists with a class map, a multi-label list (several colours per
image) and a list naming an image that is not there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = ("red", "green", "blue")


def _images(folder: Path, lit: list[list[int]]) -> list[str]:
    """One 8x8 PNG per entry of `lit`, bright in those channels; their paths under folder."""
    (folder / "img").mkdir(parents=True)
    rng = np.random.default_rng(0)
    paths = []
    for i, on in enumerate(lit):
        pixels = rng.integers(0, 40, (8, 8, 3)) + 20
        pixels[..., on] += 160
        Image.fromarray(pixels.astype(np.uint8)).save(folder / "img" / f"{i}.png")
        paths.append(f"img/{i}.png")
    return paths


def _csv(path: Path, paths: list[str], labels: list[str]) -> None:
    path.write_text("path,label\n" + "".join(f"{p},{lb}\n" for p, lb in zip(paths, labels)))


def setup(folder: Path) -> None:
    single = [[i % 3] for i in range(30)]
    paths = _images(folder / "colours", single)
    labels = [COLOURS[on[0]] for on in single]
    _csv(folder / "colours" / "labels.csv", paths, labels)
    (folder / "colours" / "labels.jsonl").write_text(
        "".join(f'{{"path": "{p}", "label": "{lb}"}}\n' for p, lb in zip(paths, labels))
    )
    split = folder / "split"
    paths = _images(split, single)
    for name, part in (("train", slice(0, 21)), ("val", slice(21, 24)), ("test", slice(24, 30))):
        _csv(split / f"{name}.csv", paths[part], labels[part])
    (split / "classes.txt").write_text("red\ngreen\nblue\n")
    rng = np.random.default_rng(1)
    several = [[k for k in range(3) if rng.random() < 0.5] or [i % 3] for i in range(60)]
    paths = _images(folder / "scenes", several)
    _csv(
        folder / "scenes" / "train.csv", paths, [";".join(COLOURS[k] for k in on) for on in several]
    )
    paths = _images(folder / "broken", single[:3])
    _csv(folder / "broken" / "labels.csv", [paths[0], "img/gone.png", paths[2]], labels[:3])
