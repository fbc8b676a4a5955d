"""Image files as they come: broken ones are skipped with a warning and counted in training and
named in the error at prediction time; odd modes become the model's channels with the right
values; data folders that cannot be used say why.

Covered elsewhere, not repeated here: garbage bytes (`test_data.py::
test_corrupt_training_images_are_skipped_and_counted`, `test_cli_train.py::
test_training_on_a_folder_skips_corrupt_images`, `test_predict_corrupt_and_missing_images`),
a missing image, a missing or empty data folder and one without images
(`test_data.py::test_missing_and_empty_folders`, `test_cli_train.py::test_empty_data_folder`).
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from _run import tiny_model
from PIL import Image

import vitkit
from vitkit.data import (
    CorruptImageError,
    DataError,
    ImageFiles,
    collate,
    load_data,
    open_image,
    read_image,
)
from vitkit.train import TrainConfig, fit
from vitkit.train.tasks import ClassificationTask

LIMIT = 100  # PIL.Image.MAX_IMAGE_PIXELS in these tests: a 12x12 image is already "huge"


def _png(size: int = 8, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (size, size), 90 if mode == "L" else (90, 40, 200)).save(buffer, "PNG")
    return buffer.getvalue()


BAD = {
    "truncated": _png(32)[:60],
    "zero-byte": b"",
    "not-an-image": b"name,label\ncat.png,0\n",
    "bomb": _png(16),  # 256 pixels > 2 * LIMIT: Pillow raises DecompressionBombError
    "bomb-warning": _png(12),  # 144 pixels > LIMIT: Pillow only warns, vitkit refuses
}


@pytest.fixture(autouse=True)
def small_pixel_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT)


def bad_file(folder: Path, kind: str) -> Path:
    path = folder / f"{kind}.png"
    path.write_bytes(BAD[kind])
    return path


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_file_is_named_when_read(tmp_path, kind):
    path = bad_file(tmp_path, kind)
    with pytest.raises(CorruptImageError, match=rf"^cannot read image {path}: ") as err:
        read_image(path)
    assert "\n" not in str(err.value)
    if kind.startswith("bomb"):
        assert "decompression bomb" in str(err.value) and "MAX_IMAGE_PIXELS" in str(err.value)


def test_bad_files_are_skipped_counted_and_warned_once_in_training(tmp_path, caplog):
    good = tmp_path / "good.png"
    good.write_bytes(_png(8))
    bad = [bad_file(tmp_path, kind) for kind in BAD]
    samples = [(str(good), i % 2) for i in range(30)] + [(str(p), 0) for p in bad]
    train = ImageFiles(samples, in_chans=3, img_size=(8, 8), skip_corrupt=True)
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        result = fit(
            ClassificationTask(
                tiny_model(in_chans=3),
                TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, mixup=0, cutmix=0),
            ),
            train,
            ImageFiles(samples[:4], in_chans=3, img_size=(8, 8)),
            TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, mixup=0, cutmix=0),
        )
    assert result.corrupt_images == len(BAD)
    assert [row["skipped_images"] for row in result.history] == [len(BAD)] * 2
    for path in bad:  # one warning per file, not one per epoch
        assert sum(str(path) in m for m in caplog.messages) == 1
    images, labels = collate([train[i] for i in range(len(train))])
    assert images.shape == (30, 3, 8, 8) and labels.shape == (30,)


@pytest.mark.parametrize("kind", BAD)
def test_predict_skips_and_names_the_bad_file(tmp_path, run_cli, kind):
    """One unreadable image does not abort predict: the good one is predicted, the bad one
    named on stderr with the reason, and the exit status (3) says one was skipped."""
    checkpoint = tmp_path / "model.safetensors"
    vitkit.save(tiny_model(), checkpoint, meta={"class_names": list("0123456789")})
    good = tmp_path / "good.png"
    good.write_bytes(_png(8, "L"))
    path = bad_file(tmp_path, kind)
    code, stdout, err = run_cli("predict", "--checkpoint", checkpoint, good, path)
    assert code == 3 and stdout.startswith(f"{good}: ")
    assert err.startswith(f"vitkit: skipped 1 of 2 images, unreadable: {path} (")
    assert err.count("\n") == 1


# -- modes ----------------------------------------------------------------------------------


def _saved(tmp_path: Path, image: Image.Image, name: str = "x.png") -> Path:
    path = tmp_path / name
    image.save(path)
    return path


def test_grey_to_one_and_three_channels(tmp_path):
    path = _saved(tmp_path, Image.new("L", (4, 4), 200))
    assert torch.equal(read_image(path, in_chans=1), torch.full((1, 4, 4), 200 / 255))
    assert torch.equal(read_image(path, in_chans=3), torch.full((3, 4, 4), 200 / 255))
    bilevel = _saved(tmp_path, Image.new("1", (4, 4), 1), "bilevel.png")
    assert torch.equal(read_image(bilevel, in_chans=1), torch.ones(1, 4, 4))


def test_rgba_drops_alpha(tmp_path):
    """As torchvision's loader does: the colour stays, even where the pixel is transparent."""
    path = _saved(tmp_path, Image.new("RGBA", (4, 4), (10, 20, 30, 0)))
    expected = torch.tensor([10, 20, 30]).view(3, 1, 1).expand(3, 4, 4) / 255
    assert torch.equal(read_image(path, in_chans=3), expected)
    luma = (10 * 299 + 20 * 587 + 30 * 114) // 1000  # ITU-R 601-2, as Pillow's "L"
    assert torch.equal(read_image(path, in_chans=1), torch.full((1, 4, 4), luma / 255))


def test_palette_colours(tmp_path):
    image = Image.new("P", (4, 4), 1)
    image.putpalette([0, 0, 0, 255, 0, 128] + [0] * (256 * 3 - 6))
    image.putpixel((0, 0), 0)
    x = read_image(_saved(tmp_path, image), in_chans=3)
    assert torch.equal(x[:, 1, 1], torch.tensor([255, 0, 128]) / 255)
    assert torch.equal(x[:, 0, 0], torch.zeros(3))


def test_16_bit_grey_is_scaled_not_clipped(tmp_path):
    """Pillow's convert("L") would clip every value over 255 to white."""
    values = np.array([[0, 1000, 30000, 65535]] * 4, dtype=np.uint16)
    path = _saved(tmp_path, Image.fromarray(values))
    assert Image.open(path).mode == "I;16"  # a real 16-bit PNG
    expected = torch.from_numpy(values.astype(np.float32) / 65535)
    assert torch.allclose(read_image(path, in_chans=1)[0], expected, rtol=0, atol=1e-7)
    three = read_image(path, in_chans=3)
    assert three.shape == (3, 4, 4) and torch.equal(three[0], three[2])
    flat = _saved(tmp_path, Image.fromarray(np.full((8, 8), 40000, np.uint16)), "flat.png")
    resized = read_image(flat, in_chans=1, size=(4, 2))
    assert resized.shape == (1, 4, 2)
    assert torch.allclose(resized, torch.full((1, 4, 2), 40000 / 65535), rtol=0, atol=1e-6)


def test_16_bit_grey_becomes_8_bit_for_the_transforms(tmp_path):
    values = np.array([[0, 257, 30000, 65535]], dtype=np.uint16)
    path = _saved(tmp_path, Image.fromarray(values))
    assert np.asarray(open_image(path, in_chans=1)).tolist() == [[0, 1, 117, 255]]  # v / 257
    assert open_image(path, in_chans=3).getpixel((2, 0)) == (117, 117, 117)


def test_32_bit_integer_pixels_in_the_16_bit_range_are_read(tmp_path):
    """Pillow opens many 16-bit files as mode I (32-bit signed)."""
    values = np.array([[0, 1000, 65535]], dtype=np.int32)
    path = _saved(tmp_path, Image.fromarray(values), "wide.tif")
    assert Image.open(path).mode == "I"
    expected = torch.from_numpy(values.astype(np.float32) / 65535)
    assert torch.allclose(read_image(path, in_chans=1)[0], expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    "values, message",
    [
        (np.array([[0, 70000]], np.int32), "(PIL mode I) run from 0 to 70000"),
        (np.array([[-5, 10]], np.int32), "(PIL mode I) run from -5 to 10"),
        (np.array([[0.0, 255.0]], np.float32), "(PIL mode F) run from 0 to 255, outside [0, 1]"),
        (np.array([[0.0, np.inf]], np.float32), "(PIL mode F) run from 0 to inf"),
    ],
)
def test_32_bit_pixels_of_unknown_range_are_refused_naming_the_mode(tmp_path, values, message):
    path = _saved(tmp_path, Image.fromarray(values), "wide.tif")
    for read in (read_image, open_image):
        with pytest.raises(CorruptImageError, match=rf"^cannot read image {path}: its 32-bit") as e:
            read(path)
        assert message in str(e.value) and "save the image as 8- or 16-bit" in str(e.value)
    good = _saved(tmp_path, Image.new("RGB", (4, 4)), "good.png")
    dataset = ImageFiles([(str(path), 0), (str(good), 1)], skip_corrupt=True)  # training skips
    assert dataset[0] is None and list(dataset.corrupt) == [str(path)]
    assert dataset[1][1] == 1


def test_32_bit_float_pixels_in_0_1_are_read_exactly(tmp_path):
    values = np.array([[0.0, 0.25, 1.0]], dtype=np.float32)
    path = _saved(tmp_path, Image.fromarray(values), "float.tif")
    assert Image.open(path).mode == "F"
    assert torch.equal(read_image(path, in_chans=3), torch.from_numpy(values).expand(3, 1, 3))
    assert np.asarray(open_image(path, in_chans=1)).tolist() == [[0, 64, 255]]


def test_lab_and_cmyk_are_converted(tmp_path):
    lab = _saved(tmp_path, Image.new("LAB", (2, 2), (100, 128, 128)), "lab.tif")
    assert open_image(lab).getpixel((0, 0)) == Image.new("LAB", (1, 1), (100, 128, 128)).convert(
        "RGB"
    ).getpixel((0, 0))
    assert open_image(lab, in_chans=1).mode == "L"  # LAB -> RGB -> L (Pillow has no LAB -> L)
    cmyk = _saved(tmp_path, Image.new("CMYK", (2, 2), (0, 255, 255, 0)), "cmyk.tif")
    assert open_image(cmyk).getpixel((1, 1)) == (255, 0, 0)


def test_a_mode_pillow_cannot_convert_is_refused_naming_it(tmp_path, monkeypatch):
    path = _saved(tmp_path, Image.new("L", (2, 2)))
    monkeypatch.setattr(Image, "open", lambda _: Image.new("La", (2, 2)))  # not writable
    with pytest.raises(CorruptImageError) as err:
        open_image(path)
    assert str(err.value) == (
        f"cannot read image {path}: Pillow cannot convert its mode La to RGB; save it as RGB "
        "or greyscale"
    )


@pytest.mark.parametrize("orientation, turned", [(3, 180), (6, 270), (8, 90)])
def test_exif_orientation_is_applied(tmp_path, orientation, turned):
    """A phone photo stored sideways is read upright (as viewers show it)."""
    stored = Image.new("RGB", (4, 2))
    stored.putpixel((0, 0), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    path = tmp_path / "phone.jpg"
    stored.save(path, exif=exif, quality=100, subsampling=0)
    upright = stored.rotate(turned, expand=True)
    for image in (open_image(path), read_image(path)):
        size = image.size if isinstance(image, Image.Image) else image.shape[:0:-1]
        assert tuple(size) == upright.size
    red = np.asarray(open_image(path))[..., 0] > 128  # the one red pixel, where it belongs
    assert red.sum() == 1 and red[tuple(np.argwhere(np.asarray(upright)[..., 0] > 128)[0])]


# -- folders --------------------------------------------------------------------------------


def _class_folders(root: Path, classes: dict[str, int]) -> Path:
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            (root / name / f"{i}.png").write_bytes(_png(8))
    return root


def test_a_class_folder_without_images(tmp_path, run_cli):
    root = _class_folders(tmp_path / "pets", {"cat": 3, "dog": 0, "eel": 2})
    (root / "dog" / "notes.txt").write_text("no pictures yet")
    message = (
        f"class folder(s) {root / 'dog'} hold no images (or cannot be read); add images or "
        "remove the folder, as every folder is a class"
    )
    with pytest.raises(DataError) as err:
        load_data(str(root))
    assert str(err.value) == message
    code, _, stderr = run_cli("train", "--data", root, "--out", tmp_path / "run")
    assert (code, stderr) == (2, f"vitkit: error: {message}\n")


def test_an_unreadable_data_folder(tmp_path, monkeypatch, run_cli):
    root = _class_folders(tmp_path / "pets", {"cat": 2, "dog": 2})
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == root:
            raise PermissionError(13, "Permission denied")
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)  # root reads anything, even at mode 000
    message = f"cannot list the data folder {root} (Permission denied); check its permissions"
    with pytest.raises(DataError) as err:
        load_data(str(root))
    assert str(err.value) == message
    code, _, stderr = run_cli("train", "--data", root, "--out", tmp_path / "run")
    assert (code, stderr) == (2, f"vitkit: error: {message}\n")


def test_a_folder_with_one_class(tmp_path, run_cli):
    root = _class_folders(tmp_path / "pets", {"cat": 3})
    message = (
        f"data folder {root} has one class (cat); a classifier needs at least two: put each "
        f"class's images in a folder of its own under {root}"
    )
    code, _, stderr = run_cli("train", "--data", root, "--out", tmp_path / "run")
    assert (code, stderr) == (2, f"vitkit: error: {message}\n")
