"""Data: named sources split with a fixed seed, image decoding, datasets and transforms.

Imports nothing from the rest of vitkit: the model, the weights and the training job build on it.
"""

from .augment import Mixup
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
from .images import IMAGE_EXTENSIONS, CorruptImageError, DataError, open_image, read_image
from .rand_augment import RandAugment, parse_rand_augment
from .sources import SOURCES, detect_source, load_data, register_source
from .transforms import build_transform, eval_transform

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
    "eval_transform",
    "load_data",
    "open_image",
    "parse_rand_augment",
    "read_image",
    "register_source",
    "split_indices",
]
