"""Large JPEGs decoded at 1/2..1/8 scale (`Image.draft`): the pixels after the pipeline's
resize stay within the measured bound of full decoding, the geometry is the full image's
(EXIF orientations and partial 8x8 blocks included), the decoder never goes below the size the
transform needs, and the option is off by default."""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
from PIL import Image

from vitkit.data import ImageFiles, Transformed, build_transform, eval_transform, open_image
from vitkit.data.data_config import DataConfig
from vitkit.data.images import ReducedImage
from vitkit.data.transforms import RandomResizedCrop, ResizeCenterCrop

# Reduced against full decoding after the resize, photo-like 969x729 JPEGs (quality 90) at 1/8
# for a 56 crop: max 16, mean 0.74 levels of 255 over the 8 orientations and 4 crops measured;
# a box off by the partial block (the orientation mapping left out) gives max 70-122, mean 3-5.
# At 2000x1500 -> 224 (1/4, bilinear): max 12, mean 0.38 over 20 photos.
MAX_LEVELS, MEAN_LEVELS = 24, 1.0


def _photo(seed: int, width: int = 969, height: int = 729, orientation: int = 1) -> bytes:
    """A JPEG like a photo: smooth colour waves, hard-edged rectangles, sensor noise."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, f = g.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * x / (width / 7) + b * y / (height / 7) + 6 * f)
    for _ in range(12):
        x0, y0 = g.integers(0, width - width // 20), g.integers(0, height - height // 20)
        h, w = g.integers(height // 30, height // 3), g.integers(width // 30, width // 3)
        img[y0 : y0 + h, x0 : x0 + w] = g.uniform(0, 255, 3)
    img += g.normal(0, 6, img.shape)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90, exif=exif)
    return buf.getvalue()


def _difference(a: Image.Image, b: Image.Image) -> tuple[int, float]:
    d = np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16))
    return int(d.max()), float(d.mean())


@pytest.mark.parametrize("orientation", range(1, 9))
def test_reduced_eval_crop_matches_full_decoding_in_every_orientation(orientation):
    data = _photo(orientation, orientation=orientation)
    step = ResizeCenterCrop((56, 56), crop_pct=0.875, interpolation="bilinear", draft=True)
    full = open_image(io.BytesIO(data))
    reduced = open_image(io.BytesIO(data), needed=step.decode_size)
    assert isinstance(reduced, ReducedImage) and reduced.scale == 8
    assert reduced.size == (full.height, full.width)  # upright: 729x969 or 969x729
    most, mean = _difference(step(full), step(reduced))
    assert most <= MAX_LEVELS and mean <= MEAN_LEVELS, (most, mean)


def test_reduced_train_crop_draws_the_same_box_and_matches_full_decoding():
    step = RandomResizedCrop((56, 56), scale=(0.5, 1.0), interpolation="bicubic", draft=True)
    for seed in range(3):
        data = _photo(10 + seed)
        full = open_image(io.BytesIO(data))
        reduced = open_image(io.BytesIO(data), needed=step.decode_size)
        assert reduced.scale == 8
        most, mean = _difference(
            step(full, random.Random(seed)), step(reduced, random.Random(seed))
        )
        assert most <= MAX_LEVELS and mean <= MEAN_LEVELS, (most, mean)


def test_the_decoder_never_gives_fewer_pixels_than_needed():
    data = _photo(0)  # 969 x 729
    for want, scale in [((365, 485), 1), ((364, 484), 2), ((243, 323), 2), ((91, 121), 8)]:
        image = open_image(io.BytesIO(data), needed=lambda h, w, want=want: want)
        if scale == 1:  # 969 // 485 = 1: half size would be 484 < 485 columns
            assert isinstance(image, Image.Image) and image.size == (969, 729)
            continue
        assert image.scale == scale
        assert image.image.height >= want[0] and image.image.width >= want[1]
        assert image.box == (0, 0, 969 / scale, 729 / scale)
    png = io.BytesIO()
    Image.new("RGB", (969, 729)).save(png, "PNG")
    png.seek(0)  # no reduced decoding for other formats: the whole image, as without `needed`
    assert open_image(png, needed=lambda h, w: (8, 8)).size == (969, 729)


def _pil_scale(size: tuple[int, int], want: tuple[int, int] | None) -> int:
    """The reduction Pillow's JPEG draft takes for `want`, and only from 2x on (as vitkit)."""
    if want is None or size[0] // want[0] < 2 or size[1] // want[1] < 2:
        return 1
    ratio = min(size[0] // want[0], size[1] // want[1])
    return next(s for s in (8, 4, 2, 1) if ratio >= s)


@pytest.mark.parametrize(
    "size, scale, expected",
    [
        ((1500, 2000), (0.08, 1.0), 1),  # the smallest crop is 424 rows: no room for 1/2
        ((3024, 4032), (0.08, 1.0), 2),
        ((6000, 8000), (0.08, 1.0), 4),
        ((1500, 2000), (0.5, 1.0), 4),
        ((3000, 700), (0.08, 1.0), 1),  # too tall for the ratios: the centred fallback crop
        ((1000, 6000), (0.25, 1.0), 4),  # too wide: the fallback again
    ],
)
def test_every_random_crop_keeps_the_output_size_after_reduction(size, scale, expected):
    step = RandomResizedCrop((224, 224), scale=scale, draft=True)
    reduction = _pil_scale(size, step.decode_size(*size))
    assert reduction == expected
    rng = random.Random(0)
    boxes = [step.box(*size, rng) for _ in range(3000)]
    smallest = min(h for _, _, h, _ in boxes), min(w for _, _, _, w in boxes)
    assert smallest[0] / reduction >= 224 and smallest[1] / reduction >= 224, smallest
    # the bound is tight: one more halving would give the smallest crop too few pixels
    assert min(smallest) / (2 * reduction) < 224 or reduction == 8


def test_draft_is_off_by_default_and_the_loader_hands_on_reduced_images(tmp_path):
    config = DataConfig(input_size=(3, 56, 56), mean=0.5, std=0.5, crop_pct=0.875)
    common = {"img_size": (56, 56), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    assert eval_transform(config).decode_size(729, 969) is None
    assert build_transform(True, **common).decode_size(729, 969) is None
    squash = build_transform(False, **common, draft=True)  # crop_pct 1: straight to 56x56
    assert squash.decode_size(729, 969) == (56, 56)
    path = tmp_path / "photo.jpg"
    path.write_bytes(_photo(3))
    files = ImageFiles([(str(path), 0)])
    plain, drafted = eval_transform(config), eval_transform(config, draft=True)
    full = plain(open_image(path))
    assert Transformed(files, plain)[0][0].equal(full)  # off: exactly the full decoding
    reduced = drafted(open_image(path, needed=drafted.decode_size))
    assert Transformed(files, drafted)[0][0].equal(reduced)
    levels = (reduced - full).abs().max().item() * 0.5 * 255  # std 0.5: back to 0..255
    assert 0 < levels <= MAX_LEVELS + 1e-3
    assert math.isclose(levels, round(levels), abs_tol=1e-3)
