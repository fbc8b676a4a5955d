"""DeiT transforms on tensors: shapes, ranges, exact values where they are defined."""

from __future__ import annotations

import pytest
import torch

from vitkit.data import augment
from vitkit.data.augment import (
    RAND_AUGMENT_OPS,
    Mixup,
    Normalize,
    RandAugment,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    build_transform,
    one_hot,
    parse_rand_augment,
)


@pytest.fixture
def image():
    torch.manual_seed(0)
    return torch.rand(3, 12, 16)


def test_random_resized_crop_shape_range_and_box(image):
    crop = RandomResizedCrop((8, 8), scale=(0.5, 1.0))
    for _ in range(20):
        top, left, h, w = crop.box(12, 16)
        assert 0 <= top and top + h <= 12 and 0 <= left and left + w <= 16
        assert 0.5 * 192 * 0.7 <= h * w <= 192
        out = crop(image)
        assert out.shape == (3, 8, 8) and 0 <= out.min() and out.max() <= 1


def test_flip_is_exact(image):
    assert torch.equal(RandomHorizontalFlip(1.0)(image), image.flip(-1))
    assert RandomHorizontalFlip(0.0)(image) is image


@pytest.mark.parametrize("op", sorted(RAND_AUGMENT_OPS))
@pytest.mark.parametrize("chans", [1, 3])
def test_each_rand_augment_op_keeps_shape_and_range(op, chans):
    torch.manual_seed(1)
    x = torch.rand(chans, 8, 8)
    out = RandAugment(num_ops=1, magnitude=9, mstd=0.0, ops=[op])(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.min() >= 0 and out.max() <= 1
    if op == "Identity":
        assert torch.equal(out, x)


def test_rand_augment_ops_values():
    x = torch.linspace(0, 1, 64).view(1, 8, 8)
    assert torch.allclose(augment._solarize(x, 0.5), torch.where(x >= 0.5, 1 - x, x))
    stretched = augment._autocontrast(x * 0.5 + 0.25, 1.0)
    assert torch.allclose(stretched, x, atol=1e-6)
    assert torch.allclose(augment._posterize(x, 1.0), torch.floor(x * 255 / 16) * 16 / 255)
    # a zero-angle rotation and a zero shear are the identity
    assert torch.allclose(augment._affine(x, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), x, atol=1e-6)


def test_parse_rand_augment():
    ra = parse_rand_augment("rand-m7-n3-mstd0.2")
    assert (ra.magnitude, ra.num_ops, ra.mstd) == (7.0, 3, 0.2)
    assert parse_rand_augment("none") is None and parse_rand_augment(None) is None
    with pytest.raises(ValueError, match="unknown RandAugment field 'q4'"):
        parse_rand_augment("rand-m9-q4")
    with pytest.raises(ValueError, match="must start with 'rand'"):
        parse_rand_augment("auto-m9")


def test_random_erasing(image):
    assert RandomErasing(p=0.0)(image) is image
    torch.manual_seed(3)
    out = RandomErasing(p=1.0)(image)
    changed = (out != image).any(0)
    assert out.shape == image.shape and changed.any()
    rows, cols = changed.nonzero().T
    box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
    assert box == changed.sum()  # one filled rectangle
    assert 0.02 * 192 * 0.5 <= box <= 192 / 3 + 16


def test_normalize_exact(image):
    out = Normalize([0.5, 0.25, 0.0], [0.5, 0.5, 2.0])(image)
    assert torch.allclose(out[0], (image[0] - 0.5) / 0.5)
    assert torch.allclose(out[2], image[2] / 2.0)


def test_build_transform_train_and_eval(image):
    eval_tf = build_transform(False, img_size=(12, 16), mean=[0.5] * 3, std=[0.5] * 3)
    assert torch.allclose(eval_tf(image), (image - 0.5) / 0.5)
    resized = build_transform(False, img_size=(6, 8), mean=[0.5] * 3, std=[0.5] * 3)(image)
    assert resized.shape == (3, 6, 8)
    train_tf = build_transform(True, img_size=(8, 8), mean=[0.5] * 3, std=[0.5] * 3)
    assert [type(t).__name__ for t in train_tf.transforms] == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "RandAugment",
        "Normalize",
        "RandomErasing",
    ]
    assert train_tf(image).shape == (3, 8, 8)
    light = build_transform(
        True,
        img_size=(8, 8),
        mean=[0.0],
        std=[1.0],
        crop_scale=None,
        hflip=0,
        rand_augment=None,
        reprob=0,
    )
    assert [type(t).__name__ for t in light.transforms] == ["Resize", "Normalize"]


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
