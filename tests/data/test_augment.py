"""vitkit's per-image transforms on tensors and images: shapes, exact values, reproducibility,
full-resolution decoding; and the batch mixing. Parity with timm: test_timm_transforms.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data import (
    ImageFiles,
    Subset,
    TensorImages,
    Transformed,
    build_transform,
    parse_rand_augment,
)
from vitkit.data.augment import Mixup, one_hot
from vitkit.data.data_config import DataConfig
from vitkit.data.transforms import (
    Normalize,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    eval_transform,
)
from vitkit.train.distributed import make_loader, set_epoch

NORM = {"mean": [0.5] * 3, "std": [0.5] * 3}


@pytest.fixture
def image():
    torch.manual_seed(0)
    return (torch.rand(3, 12, 16) * 255).round() / 255  # 8-bit values


def test_random_resized_crop_box_stays_inside_and_keeps_its_area(image):
    crop = RandomResizedCrop((8, 8), scale=(0.5, 1.0))
    rng = random.Random(0)
    for _ in range(50):
        top, left, h, w = crop.box(12, 16, rng)
        assert 0 <= top and top + h <= 12 and 0 <= left and left + w <= 16
        assert 0.5 * 192 * 0.7 <= h * w <= 192
    assert crop(image).shape == (3, 8, 8)
    # no crop of ratio 3..4 fits a 12x16 image 10 times in a row: the widest centred one
    assert RandomResizedCrop((8, 8), (0.9, 1.0), (3.0, 4.0)).box(12, 16, rng) == (3, 0, 5, 16)


def test_tensor_and_image_give_the_same_crop(image):
    """In-memory data and image files go through the same resampling."""
    pil = Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy())
    crop = RandomResizedCrop((10, 10), interpolation="bicubic")
    from_tensor = crop(image, random.Random(4))
    from_image = torch.from_numpy(np.asarray(crop(pil, random.Random(4))).copy()).permute(2, 0, 1)
    assert torch.equal(from_tensor, from_image.float() / 255)


def test_flip_is_exact(image):
    assert torch.equal(RandomHorizontalFlip(1.0)(image), image.flip(-1))
    assert RandomHorizontalFlip(0.0)(image) is image


def test_random_erasing_fills_one_rectangle_and_leaves_the_input(image):
    assert RandomErasing(p=0.0)(image) is image
    before = image.clone()
    out = RandomErasing(p=1.0)(image, random.Random(3))
    assert torch.equal(image, before)  # a copy is erased, not the dataset's tensor
    changed = (out != image).any(0)
    rows, cols = changed.nonzero().T
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    assert box == changed.sum() and 0.02 * 192 * 0.5 <= box <= 192 / 3 + 16
    zeros = RandomErasing(p=1.0, mode="const")(image, random.Random(3))
    assert torch.equal(zeros[:, changed], torch.zeros(3, int(box)))  # the same box: same draws
    with pytest.raises(ValueError, match="unknown erasing mode 'noise'; use one of pixel"):
        RandomErasing(mode="noise")


def test_normalize_exact(image):
    out = Normalize([0.5, 0.25, 0.0], [0.5, 0.5, 2.0])(image)
    assert torch.allclose(out[0], (image[0] - 0.5) / 0.5)
    assert torch.allclose(out[2], image[2] / 2.0)


def test_build_transform_steps(image):
    eval_tf = build_transform(False, img_size=(12, 16), **NORM)
    assert torch.equal(eval_tf(image), (image - 0.5) / 0.5)  # native size: only normalised
    assert build_transform(False, img_size=(6, 8), **NORM)(image).shape == (3, 6, 8)
    train_tf = build_transform(True, img_size=(8, 8), **NORM)
    assert [type(t).__name__ for t in train_tf.steps] == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "RandAugment",
        "ToTensor",
        "Normalize",
        "RandomErasing",
    ]
    assert train_tf(image).shape == (3, 8, 8)
    light = build_transform(
        True, img_size=(8, 8), mean=[0.0], std=[1.0], crop_scale=None, hflip=0,
        rand_augment=None, reprob=0,
    )  # fmt: skip
    assert [type(t).__name__ for t in light.steps] == ["ResizeCenterCrop", "ToTensor", "Normalize"]
    assert not light.random
    with pytest.raises(ValueError, match="unknown interpolation 'cubic'; use one of nearest"):
        build_transform(False, img_size=(8, 8), interpolation="cubic", **NORM)
    with pytest.raises(ValueError, match=r"crop_pct must be in \(0, 1\], got 1.5"):
        build_transform(False, img_size=(8, 8), crop_pct=1.5, **NORM)


def test_training_draws_follow_torchs_seed(image):
    """One random.Random per image, seeded from torch: a seeded (or resumed) run repeats."""
    tf = build_transform(True, img_size=(8, 8), reprob=1.0, **NORM)
    torch.manual_seed(7)
    first = [tf(image) for _ in range(3)]
    torch.manual_seed(7)
    again = [tf(image) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], first[1])


class Draws(Dataset):
    """Item i: (i, a draw of torch's and of Python's global generator), as a transform of
    one's own might draw."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        drawn = [float(torch.rand(())), random.random()]
        return torch.tensor([float(i), *drawn], dtype=torch.float64), i % 2


def epoch_batches(dataset, workers: int, epoch: int, start: int = 0) -> list:
    loader = make_loader(dataset, 4, train=True, seed=3, num_workers=workers)
    set_epoch(loader, epoch, start=start)
    return list(loader)


def same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(a, b)
    )


def test_augmented_batches_are_the_same_with_0_and_2_workers():
    """Crops, flips, RandAugment and erasing of a training loader's items are seeded from
    (seed, epoch, index): loader workers change nothing, nor does the main process's own
    random stream (which the loading leaves where it was)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (12, 3, 20, 20), dtype=torch.uint8, generator=gen)
    tf = build_transform(True, img_size=(16, 16), reprob=0.5, **NORM)
    assert [type(t).__name__ for t in tf.steps] == [
        "RandomResizedCrop", "RandomHorizontalFlip", "RandAugment", "ToTensor", "Normalize",
        "RandomErasing",
    ]  # fmt: skip
    data = Transformed(TensorImages(images, torch.arange(12)), tf)
    torch.manual_seed(5)
    in_process = epoch_batches(data, 0, epoch=1)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), after)  # loading drew nothing from the global stream
    assert same_batches(epoch_batches(data, 2, epoch=1), in_process)
    other_epoch = epoch_batches(data, 0, epoch=2)
    assert not any(torch.equal(x[0], y[0]) for (x, _), (y, _) in zip(other_epoch, in_process))


def test_item_seeds_cover_torchs_and_pythons_generators_and_a_resumed_epoch():
    full = epoch_batches(Draws(), 2, epoch=0)
    assert same_batches(epoch_batches(Draws(), 0, epoch=0), full)
    # resumed after 2 of 5 batches (start: 8 items): the remaining batches, draw for draw
    assert same_batches(epoch_batches(Draws(), 2, epoch=0, start=8), full[2:])
    by_index = {int(row[0]): row[1:] for x, _ in full for row in x}
    again = {int(row[0]): row[1:] for x, _ in epoch_batches(Draws(), 0, epoch=1) for row in x}
    assert sorted(by_index) == sorted(again) == list(range(20))
    assert all(not torch.equal(by_index[i], again[i]) for i in range(20))  # a new epoch
    assert len({tuple(v.tolist()) for v in by_index.values()}) == 20  # distinct per item


def test_rand_augment_strings():
    ra = parse_rand_augment("rand-m9-mstd0.5-inc1")  # DeiT's
    assert (ra.magnitude, ra.num_ops, ra.mstd, ra.prob, ra.increasing) == (9, 2, 0.5, 0.5, True)
    ra = parse_rand_augment("rand-m7-n3-p0.3-mmax15-mstd200")
    assert (ra.magnitude, ra.num_ops, ra.prob, ra.magnitude_max) == (7, 3, 0.3, 15)
    assert ra.mstd == float("inf")  # over 100: uniform in [0, m]
    assert parse_rand_augment("rand").magnitude == 10  # timm's default
    assert parse_rand_augment("none") is None and parse_rand_augment(None) is None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rand-m9-q4", "unknown RandAugment field 'q4' in 'rand-m9-q4'; use m, n, p, mstd"),
        ("rand-m9-inc", "unknown RandAugment field 'inc' in 'rand-m9-inc'"),
        ("rand-m9.5.1", "bad RandAugment field 'm9.5.1' in 'rand-m9.5.1'"),
        ("auto-m9", "RandAugment spec 'auto-m9' must start with 'rand'"),
        ("rand-m9-tfoo", "unknown RandAugment op set 'tfoo' in 'rand-m9-tfoo'; use one of t3a"),
        ("rand-n16-tweights", "a weighted op set draws distinct ops: n=16 is more than its 15"),
        ("rand-p1.5", "RandAugment needs n >= 0, 0 <= p <= 1"),
    ],
)
def test_bad_rand_augment_strings(spec, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_rand_augment(spec)


def _striped(path) -> None:
    """96x32: red a quarter, green the middle half, blue a quarter."""
    stripes = np.zeros((32, 96, 3), np.uint8)
    stripes[:, :24, 0], stripes[:, 24:72, 1], stripes[:, 72:, 2] = 255, 255, 255
    Image.fromarray(stripes).save(path)


def test_transforms_get_image_files_at_full_resolution(tmp_path):
    """The decode size of ImageFiles (for use without transforms) does not shrink the image
    vitkit's transforms see: the centre crop of a 96x32 image is green."""
    _striped(tmp_path / "a.png")
    files = ImageFiles([(str(tmp_path / "a.png"), 0)], img_size=(8, 8))
    assert files[0][0].shape == (3, 8, 8)  # squashed: all three colours
    centre = build_transform(False, img_size=(16, 16), crop_mode="center", **NORM)
    for dataset in (files, Subset(files, [0])):
        x, label = Transformed(dataset, centre)[0]
        assert label == 0 and torch.equal(x * 0.5 + 0.5, torch.tensor([0.0, 1, 0]).view(3, 1, 1)
                                          .expand(3, 16, 16))  # fmt: skip
    squash = Transformed(files, build_transform(False, img_size=(16, 48), **NORM))[0][0]
    assert squash[0, :, :8].eq(1).all() and squash[2, :, -8:].eq(1).all()
    plain = Transformed(files, lambda x: x)[0][0]  # other callables get what __getitem__ gives
    assert plain.shape == (3, 8, 8)


def test_eval_transform_follows_the_data_config(tmp_path):
    config = DataConfig(
        input_size=(3, 16, 16), mean=(0.5,) * 3, std=(0.5,) * 3, interpolation="bicubic",
        crop_pct=0.5, crop_mode="center",
    )  # fmt: skip
    tf = eval_transform(config)
    resize_crop = tf.steps[0]
    assert (resize_crop.size, resize_crop.scale_size, resize_crop.crop_mode) == (
        (16, 16),
        (32, 32),
        "center",
    )
    assert resize_crop.resample == Image.Resampling.BICUBIC
    assert resize_crop.resized_size(40, 80) == (32, 64)  # shorter side to 16 / 0.5


def test_one_hot_smoothing_values():
    targets = one_hot(torch.tensor([2, 0]), 4, smoothing=0.1)
    assert torch.allclose(targets[0], torch.tensor([0.025, 0.025, 0.925, 0.025]))
    assert torch.allclose(targets.sum(1), torch.ones(2))


def test_mixup_and_cutmix_targets():
    torch.manual_seed(0)
    images = torch.rand(4, 3, 8, 8)
    labels = torch.tensor([0, 1, 2, 3])
    mixed, targets = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0, num_classes=5)(
        images, labels
    )
    lam = float(targets[0, 0])
    assert torch.allclose(mixed, images * lam + images.flip(0) * (1 - lam), atol=1e-6)
    assert torch.allclose(targets[0, 3], torch.tensor(1 - lam))
    mixed, targets = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0, num_classes=5)(
        images, labels
    )
    pasted = (mixed != images).any(1).float().mean((1, 2))  # share of pixels replaced
    assert torch.allclose(targets[0, 3], pasted[0], atol=1e-6)
    assert torch.allclose(targets.sum(1), torch.ones(4))
    off = Mixup(mixup_alpha=0.0, cutmix_alpha=0.0, label_smoothing=0.1, num_classes=5)
    same, soft = off(images, labels)
    assert same is images and torch.allclose(soft, one_hot(labels, 5, 0.1))
