"""vitkit's image pipeline and RandAugment run beside timm's on the same images and draws.

timm draws from Python's global `random`; vitkit from a `random.Random` handed in. Seeding
both with the same number gives both the same draws, so every op must give timm's pixels
(within 1/255; in practice exactly).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image

from _helpers import requires_timm, requires_torchvision
from vitkit.data import build_transform, parse_rand_augment
from vitkit.data.rand_augment import OP_SETS, OPS, RAND_INCREASING_OPS, RAND_OPS, RandAugment
from vitkit.data.transforms import RandomErasing, RandomHorizontalFlip, RandomResizedCrop

try:  # the tests that run timm's transforms are marked requires_timm
    from timm.data import auto_augment, create_transform
    from timm.data.auto_augment import AugmentOp, rand_augment_transform
    from timm.data.random_erasing import RandomErasing as TimmErasing
    from timm.data.transforms import RandomResizedCropAndInterpolation
except ModuleNotFoundError:
    auto_augment = create_transform = AugmentOp = rand_augment_transform = None
    TimmErasing = RandomResizedCropAndInterpolation = None

FILL = (124, 116, 104)  # timm's fill for ImageNet's mean
ONE_LEVEL = 1 / 255 + 1e-6


def picture(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Gradients, edges and noise: every filter and colour op changes it."""
    rs = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) % 32 * 8], -1)
    base = base + rs.randint(-30, 30, (height, width, 3))
    base[height // 3 : height // 2, width // 4 : width // 2] = (250, 20, 40)
    img = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    return img if mode == "RGB" else img.convert(mode)


def pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img).astype(np.int16)


def timm_op(op: AugmentOp, img: Image.Image) -> Image.Image:
    """timm's op; where it asks Pillow to posterize to 0 bits (or fewer), which Pillow now
    refuses, the black image older Pillow gave."""
    try:
        return op(img)
    except ValueError as err:
        assert "Posterize" in op.name and "bits" in str(err)
        return Image.new(img.mode, img.size)


# -- RandAugment ----------------------------------------------------------------------------


@requires_timm
@pytest.mark.parametrize("name", sorted(OPS))
def test_each_op_at_each_magnitude_is_timms(name):
    img = picture(24, 32)
    for interpolation in (None, "bicubic"):
        hparams = {"img_mean": FILL, "translate_const": 100}
        if interpolation:
            hparams["interpolation"] = Image.Resampling.BICUBIC
        ours = RandAugment(prob=1.0, fill=FILL, interpolation=interpolation)
        for magnitude in range(11):
            theirs = AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hparams)
            ours.magnitude = magnitude
            for seed in range(3):  # the signs and filters drawn differ per seed
                random.seed(seed)
                expected = pixels(timm_op(theirs, img))
                got = pixels(ours.apply_op(img, name, random.Random(seed)))
                assert np.abs(got - expected).max() <= 1, (name, magnitude, seed)


@requires_timm
@pytest.mark.parametrize("name", ["Rotate", "ShearX", "TranslateYRel", "SolarizeAdd"])
def test_ops_on_grey_images_fill_with_the_grey_of_the_fill(name):
    grey = picture(16, 16, "L")
    ours = RandAugment(prob=1.0, magnitude=10, fill=(90, 90, 90))
    hparams = {"img_mean": 90, "translate_const": 100}  # timm on 'L' needs an int fill
    random.seed(5)
    expected = pixels(AugmentOp(name, prob=1.0, magnitude=10, hparams=hparams)(grey))
    assert np.array_equal(pixels(ours.apply_op(grey, name, random.Random(5))), expected)


@requires_timm
@pytest.mark.parametrize(
    "mstd, prob, mmax", [(0.5, 0.5, None), (101.0, 0.5, None), (1.0, 1.0, 20), (0.5, 0.0, None)]
)
def test_probability_and_magnitude_noise_draw_as_timm(mstd, prob, mmax):
    """p skips ops, mstd draws N(m, mstd) (over 100: uniform), mmax moves the clip."""
    img = picture(20, 20)
    hparams = {"img_mean": FILL, "translate_const": 100, "magnitude_std": math.inf}
    hparams["magnitude_std"] = math.inf if mstd > 100 else mstd
    if mmax:
        hparams["magnitude_max"] = mmax
    ours = RandAugment(magnitude=9, mstd=hparams["magnitude_std"], prob=prob, fill=FILL)
    ours.magnitude_max = mmax
    skipped = 0
    for name in ("Rotate", "SolarizeIncreasing", "ColorIncreasing", "PosterizeIncreasing"):
        theirs = AugmentOp(name, prob=prob, magnitude=9, hparams=hparams)
        for seed in range(12):
            random.seed(seed)
            expected = timm_op(theirs, img)
            got = ours.apply_op(img, name, random.Random(seed))
            assert np.abs(pixels(got) - pixels(expected)).max() <= 1, (name, seed)
            skipped += expected is img
    assert (skipped == 48) if prob == 0 else (skipped < 48)


@requires_timm
@pytest.mark.parametrize(
    "spec",
    [
        "rand-m9-mstd0.5-inc1",  # DeiT's
        "rand-m9-mstd0.5",
        "rand-m7-n3",
        "rand-m9-n1-mmax15-mstd101",
        "rand-p0.3-m5",
        "rand-inc0-m10-n4",
        "rand",
        "rand-m9-n3-tweights",
        "rand-m5-t3a",
        "rand-t3aw-m9-mstd1-inc1",
    ],
)
def test_config_strings_build_timms_rand_augment(spec):
    theirs = rand_augment_transform(spec, {"img_mean": FILL, "translate_const": 100})
    ours = parse_rand_augment(spec, fill=FILL)
    assert ours.ops == [op.name for op in theirs.ops]
    assert ours.num_ops == theirs.num_layers
    if theirs.choice_weights is None:
        assert ours.weights is None
    else:
        assert np.allclose(np.array(ours.weights) / sum(ours.weights), theirs.choice_weights)
    for op in theirs.ops:
        assert (ours.prob, ours.magnitude) == (op.prob, op.magnitude)
        assert ours.mstd == op.magnitude_std and ours.magnitude_max == op.magnitude_max
        assert op.kwargs["fillcolor"] == ours.fill


@requires_timm
def test_op_lists_are_timms():
    assert list(RAND_OPS) == auto_augment._RAND_TRANSFORMS
    assert list(RAND_INCREASING_OPS) == auto_augment._RAND_INCREASING_TRANSFORMS
    assert parse_rand_augment("rand-m9-mstd0.5-inc1").ops == list(RAND_INCREASING_OPS)
    assert OP_SETS == {
        "3a": tuple(auto_augment._RAND_3A),
        "3aw": auto_augment._RAND_WEIGHTED_3A,
        "weights": auto_augment._RAND_WEIGHTED_0,
    }


def test_weighted_op_sets_draw_distinct_ops_by_weight():
    ra = parse_rand_augment("rand-n3-tweights")
    counts = dict.fromkeys(ra.ops, 0)
    for seed in range(2000):
        drawn = ra.draw_ops(random.Random(seed))
        assert len(set(drawn)) == 3
        for name in drawn:
            counts[name] += 1
    assert counts["Rotate"] > counts["ShearX"] > counts["TranslateXRel"] > counts["Invert"]


def test_rand_augment_of_a_tensor_is_the_op_on_its_8_bit_image():
    img = picture(16, 16)
    x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255  # (C, H, W)
    ra = parse_rand_augment("rand-m9-mstd0.5-inc1-n3")
    got = ra(x, random.Random(3))
    expected = torch.from_numpy(np.asarray(ra(img, random.Random(3))).copy()).permute(2, 0, 1)
    assert torch.equal(got, expected.float() / 255)


# -- train ops ------------------------------------------------------------------------------


@requires_timm
@pytest.mark.parametrize(
    "size, scale, ratio",
    [((40, 56), (0.08, 1.0), (3 / 4, 4 / 3)), ((17, 90), (0.5, 1.0), (3 / 4, 4 / 3)),
     ((60, 30), (0.95, 1.0), (3.0, 4.0)), ((30, 60), (0.95, 1.0), (0.2, 0.3))],
)  # fmt: skip
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "random"])
def test_random_resized_crop_is_timms(size, scale, ratio, interpolation):
    """The last two force the fallback (no crop of that ratio fits)."""
    img = picture(*size)
    theirs = RandomResizedCropAndInterpolation((16, 24), scale, ratio, interpolation)
    ours = RandomResizedCrop((16, 24), scale, ratio, interpolation)
    for seed in range(8):
        random.seed(seed)
        expected = pixels(theirs(img))
        assert np.array_equal(pixels(ours(img, random.Random(seed))), expected), seed


@requires_timm
def test_random_erasing_is_timms():
    for mode in ("pixel", "rand", "const"):
        theirs = TimmErasing(0.5, mode=mode, device="cpu")
        ours = RandomErasing(0.5, mode=mode)
        erased = 0
        for seed in range(20):
            x = torch.randn(3, 24, 20)
            random.seed(seed)
            torch.manual_seed(seed)
            expected = theirs(x.clone())
            torch.manual_seed(seed)
            got = ours(x, random.Random(seed))
            assert torch.equal(got, expected), (mode, seed)
            erased += not torch.equal(got, x)
        assert 3 <= erased <= 17


@requires_torchvision
def test_flip_is_torchvisions():
    from torchvision.transforms import RandomHorizontalFlip as TorchvisionFlip

    img = picture(9, 13)
    assert np.array_equal(pixels(RandomHorizontalFlip(1.0)(img)), pixels(TorchvisionFlip(1.0)(img)))


@requires_timm
def test_train_pipeline_without_flip_or_augment_is_timms_draw_for_draw():
    """crop -> to tensor -> normalise -> erase, every draw from the same seed."""
    kwargs = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    theirs = create_transform(
        (3, 32, 24), is_training=True, hflip=0.0, color_jitter=None, re_prob=0.5,
        re_mode="pixel", interpolation="bicubic", scale=(0.3, 1.0), **kwargs,
    )  # fmt: skip
    ours = build_transform(
        True, img_size=(32, 24), hflip=0.0, rand_augment=None, reprob=0.5,
        interpolation="bicubic", crop_scale=(0.3, 1.0), **kwargs,
    )  # fmt: skip
    for seed in range(6):
        img = picture(50 + 7 * seed, 70 - 5 * seed, seed=seed)
        random.seed(seed)
        torch.manual_seed(seed)
        expected = theirs(img)
        torch.manual_seed(seed)
        assert torch.allclose(ours(img, random.Random(seed)), expected, atol=1e-6), seed


@requires_timm
def test_train_rand_augment_gets_timms_fill_and_filter_from_the_pipeline():
    mean = (0.485, 0.456, 0.406)
    theirs = create_transform(
        224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
        mean=mean,
    )  # fmt: skip
    timm_ra = next(t for t in theirs.transforms if type(t).__name__ == "RandAugment")
    ours = build_transform(True, img_size=(224, 224), mean=mean, std=(1, 1, 1),
                           interpolation="bicubic")  # fmt: skip
    ra = next(t for t in ours.steps if isinstance(t, RandAugment))
    assert ra.fill == timm_ra.ops[0].kwargs["fillcolor"] == FILL
    assert ra.interpolation == "bicubic"
    assert timm_ra.ops[0].kwargs["resample"] == Image.Resampling.BICUBIC


# -- eval -----------------------------------------------------------------------------------

SIZES = [(48, 64), (64, 48), (40, 40), (10, 14), (200, 30)]


@requires_timm
@pytest.mark.parametrize("crop_mode", ["center", "squash"])
@pytest.mark.parametrize(
    "img_size, crop_pct, interpolation",
    [((32, 32), 0.875, "bilinear"), ((32, 32), 0.9, "bicubic"), ((24, 32), 1.0, "bicubic"),
     ((28, 20), 0.95, "bilinear"), ((16, 16), 1.0, "lanczos")],
)  # fmt: skip
def test_eval_transform_is_timms(crop_mode, img_size, crop_pct, interpolation):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    options = {"crop_pct": crop_pct, "crop_mode": crop_mode, "interpolation": interpolation}
    theirs = create_transform((3, *img_size), is_training=False, mean=mean, std=std, **options)
    ours = build_transform(False, img_size=img_size, mean=mean, std=std, **options)
    tolerance = ONE_LEVEL / min(std)
    for size in SIZES:
        img = picture(*size)
        expected = theirs(img)
        got = ours(img)
        assert got.shape == expected.shape == (3, *img_size)
        assert (got - expected).abs().max() <= tolerance, size
        # the same picture as a float tensor (in-memory data) gives the same pixels
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255
        assert (ours(x) - expected).abs().max() <= tolerance, size


@requires_timm
def test_eval_of_grey_images_is_timms():
    theirs = create_transform((1, 20, 20), is_training=False, mean=(0.5,), std=(0.5,))
    ours = build_transform(
        False, img_size=(20, 20), mean=(0.5,), std=(0.5,), crop_pct=0.875, crop_mode="center"
    )
    img = picture(30, 45, "L")
    assert (ours(img) - theirs(img)).abs().max() <= 2 * ONE_LEVEL
