"""Data: named sources split with a fixed seed, image decoding, datasets and transforms.

Imports nothing from the rest of vitkit: the model, the weights and the training job build on it.
"""

from .augment import Mixup, RandAugment, build_transform, parse_rand_augment
from .datasets import (
    ImageFiles,
    Splits,
    Subset,
    TensorImages,
    Transformed,
    collate,
    corrupt_count,
    split_indices,
)
from .images import IMAGE_EXTENSIONS, CorruptImageError, DataError, read_image
from .sources import SOURCES, detect_source, load_data, register_source

__all__ = [
    "IMAGE_EXTENSIONS",
    "SOURCES",
    "CorruptImageError",
    "DataError",
    "ImageFiles",
    "Mixup",
    "RandAugment",
    "Splits",
    "Subset",
    "TensorImages",
    "Transformed",
    "build_transform",
    "collate",
    "corrupt_count",
    "detect_source",
    "load_data",
    "parse_rand_augment",
    "read_image",
    "register_source",
    "split_indices",
]
