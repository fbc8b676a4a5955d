"""Data sources: digits, ImageFolder, CIFAR-10/100 archives; splits; errors."""

from __future__ import annotations

import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import data
from vitkit.data import CorruptImageError, DataError, collate, load_data, split_indices
from vitkit.data.images import open_image_bytes


def _png(path: Path, value: int, size: tuple[int, int] = (6, 6), mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, (value,) * len(mode) if mode != "L" else value).save(path)


def _folder(root: Path, per_class: int = 5) -> Path:
    for label, name in enumerate(("cat", "dog")):
        for i in range(per_class):
            _png(root / name / f"{i}.png", 40 * label + i)
    return root


def test_digits_splits_are_seeded_disjoint_and_stratified():
    splits = load_data("digits", val_fraction=0.1, test_fraction=0.2, seed=0)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1259, 179, 359)
    assert splits.class_names == [str(d) for d in range(10)]
    assert (splits.in_chans, splits.img_size) == (1, (8, 8))
    image, label = splits.train[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0
    sets = [set(s.indices) for s in (splits.train, splits.val, splits.test)]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert len(sets[0] | sets[1] | sets[2]) == 1797
    again = load_data("digits", seed=0)
    assert again.test.indices == splits.test.indices
    assert load_data("digits", seed=1).test.indices != splits.test.indices
    test_labels = [splits.test[i][1] for i in range(len(splits.test))]
    assert all(35 <= test_labels.count(k) <= 37 for k in range(10))


def test_split_indices_rejects_fractions_over_one():
    with pytest.raises(ValueError, match="add up to more than 1"):
        split_indices(10, (0.6, 0.5), seed=0)


def test_image_folder_split_resize_and_channels(tmp_path):
    root = _folder(tmp_path / "pets", per_class=10)
    splits = load_data(str(root), val_fraction=0.2, test_fraction=0.2, in_chans=1, img_size=(4, 4))
    assert splits.class_names == ["cat", "dog"]
    assert (len(splits.train), len(splits.val), len(splits.test)) == (12, 4, 4)
    image, label = splits.test[0]
    assert image.shape == (1, 4, 4)
    assert splits.in_chans == 1 and splits.img_size is None
    rgb = load_data(str(root), img_size=(6, 6))
    image, _ = rgb.train[0]
    assert image.shape == (3, 6, 6)
    labels = sorted(rgb.train[i][1] for i in range(len(rgb.train)))
    assert labels.count(0) == labels.count(1)


def test_image_folder_with_ready_made_splits(tmp_path):
    _folder(tmp_path / "d" / "train", per_class=4)
    _folder(tmp_path / "d" / "test", per_class=2)
    splits = load_data(str(tmp_path / "d"), val_fraction=0.25, test_fraction=0.5)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (6, 2, 4)
    (tmp_path / "d" / "test" / "bird").mkdir()
    _png(tmp_path / "d" / "test" / "bird" / "0.png", 1)
    with pytest.raises(DataError, match="classes not in .*train: bird"):
        load_data(str(tmp_path / "d"))


def test_corrupt_training_images_are_skipped_and_counted(tmp_path, caplog):
    """A file whose header Pillow cannot identify is left out before the split (said once);
    one whose header reads but whose pixels are cut short is skipped when an epoch meets it,
    said once and counted."""
    root = _folder(tmp_path / "pets", per_class=3)
    (root / "cat" / "broken.png").write_bytes(b"not a png at all")
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "dog" / "cut.png")
    whole = (root / "dog" / "cut.png").read_bytes()
    (root / "dog" / "cut.png").write_bytes(whole[: len(whole) // 2])  # the header stays
    with pytest.raises(CorruptImageError, match=r"cannot read image .*broken\.png: cannot"):
        load_data(str(root), val_fraction=0.0, test_fraction=0.0, skip_corrupt=False)
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        splits = load_data(str(root), val_fraction=0.0, test_fraction=0.0, img_size=(6, 6))
        assert len(splits.train) == 7  # 6 images and the cut one; not broken.png
        items = [splits.train[i] for i in range(len(splits.train))]
        items += [splits.train[i] for i in range(len(splits.train))]
    assert sum(item is None for item in items) == 2
    assert data.corrupt_count(data.Transformed(splits.train, None)) == 1
    assert sum("broken.png" in r.getMessage() for r in caplog.records) == 1
    assert sum("cut.png" in r.getMessage() for r in caplog.records) == 1
    images, labels = collate(items)
    assert images.shape == (12, 3, 6, 6) and labels.shape == (12,)


def test_corrupt_image_in_memory_is_named_without_its_buffer():
    """An image held in memory is named by its place (a tar member), Pillow's reason kept,
    and the BytesIO's repr nowhere."""
    with pytest.raises(CorruptImageError) as err:
        open_image_bytes(b"not an image", "shard.tar:000017")
    assert str(err.value) == "cannot read image shard.tar:000017: cannot identify image file"


def test_corrupt_image_outside_training_names_the_file(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8garbage")
    with pytest.raises(CorruptImageError, match=r"cannot read image .*bad\.jpg"):
        data.read_image(bad)
    with pytest.raises(DataError, match=r"image .*missing\.png does not exist"):
        data.read_image(tmp_path / "missing.png")


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(DataError, match="neither a built-in source"):
        load_data(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="does not exist or is not a folder"):
        load_data(f"folder:{tmp_path / 'nope'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no class sub-folders"):
        load_data(str(tmp_path / "empty"))
    (tmp_path / "empty" / "cat").mkdir()
    (tmp_path / "empty" / "cat" / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="has no images in its class sub-folders"):
        load_data(str(tmp_path / "empty"))


def _cifar_batch(n: int, labels_key: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        labels_key.encode(): rng.integers(0, 10, size=n).tolist(),
    }


def _write_cifar10(folder: Path) -> None:
    folder.mkdir(parents=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(_cifar_batch(4, "labels", i)))
    (folder / "test_batch").write_bytes(pickle.dumps(_cifar_batch(5, "labels", 9)))
    names = [f"class{i}".encode() for i in range(10)]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}))


@pytest.mark.parametrize("packed", [True, False])
def test_cifar10_archive_and_folder(tmp_path, packed):
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar10(folder)
    path = folder
    if packed:
        path = tmp_path / "cifar-10-python.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(folder, arcname="cifar-10-batches-py")
    splits = load_data(str(path), val_fraction=0.2, seed=0)
    assert splits.name == "cifar10" and splits.class_names[3] == "class3"
    assert (len(splits.train), len(splits.val), len(splits.test)) == (16, 4, 5)
    image, label = splits.test[0]
    raw = pickle.loads((folder / "test_batch").read_bytes())
    expected = torch.from_numpy(raw[b"data"][0].reshape(3, 32, 32)).float() / 255
    assert torch.equal(image, expected) and label == raw[b"labels"][0]


def test_cifar100_folder(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 10), ("test", 3)):
        batch = _cifar_batch(n, "fine_labels", n)
        (folder / name).write_bytes(pickle.dumps(batch))
    names = [f"c{i}".encode() for i in range(100)]
    (folder / "meta").write_bytes(pickle.dumps({b"fine_label_names": names}))
    splits = load_data(str(tmp_path), val_fraction=0.0)
    assert splits.num_classes == 100 and len(splits.train) == 10 and len(splits.test) == 3


def test_cifar_refuses_code_and_junk(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    _write_cifar10(folder)
    (folder / "data_batch_2").write_bytes(pickle.dumps({b"data": Path("x")}))
    with pytest.raises(DataError, match="not a CIFAR python batch file"):
        load_data(str(folder))
    junk = tmp_path / "cifar.tar.gz"
    junk.write_bytes(b"junk")
    with pytest.raises(DataError, match="not a readable tar archive"):
        load_data(str(junk))


def test_register_source_adds_a_named_source():
    calls = {}

    def fake(path, **kwargs):
        calls.update(kwargs, path=path)
        return "splits"

    data.register_source("fake", fake)
    try:
        assert load_data("fake:/somewhere", seed=3) == "splits"
        assert calls["path"] == "/somewhere" and calls["seed"] == 3
    finally:
        del data.SOURCES["fake"]
