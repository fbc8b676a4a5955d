"""Data: named sources split with a fixed seed (map-style or streams), image decoding, datasets
and transforms.

Imports nothing from the rest of vitkit: the model, the weights and the training job build on it.
"""

from .augment import Mixup
from .datasets import (
    ImageFiles,
    SeededItems,
    Splits,
    Subset,
    TensorImages,
    Transformed,
    collate,
    corrupt_count,
    none_readable,
    split_indices,
    unreadable_files,
)
from .folders import SPLIT_FOLDERS, FolderLayout, folder_layout
from .images import (
    IMAGE_EXTENSIONS,
    CorruptImageError,
    DataError,
    LoadedImages,
    ReducedImage,
    find_images,
    load_images,
    open_image,
    read_image,
)
from .rand_augment import RandAugment, parse_rand_augment
from .shards import ShardStream, expand_pattern, write_shards
from .sources import (
    SOURCES,
    EvaluationSet,
    Source,
    detect_source,
    evaluation_set,
    load_data,
    register_source,
    source_named,
    sources_help,
)
from .streams import (
    StreamPart,
    StreamSource,
    as_stream,
    first_items,
    is_stream,
    limited,
    transformed,
)
from .transforms import build_transform, eval_resize_crop, eval_transform

__all__ = [
    "IMAGE_EXTENSIONS",
    "SOURCES",
    "SPLIT_FOLDERS",
    "CorruptImageError",
    "DataError",
    "EvaluationSet",
    "FolderLayout",
    "ImageFiles",
    "LoadedImages",
    "Mixup",
    "RandAugment",
    "ReducedImage",
    "SeededItems",
    "ShardStream",
    "Source",
    "Splits",
    "StreamPart",
    "StreamSource",
    "Subset",
    "TensorImages",
    "Transformed",
    "as_stream",
    "build_transform",
    "collate",
    "corrupt_count",
    "detect_source",
    "eval_resize_crop",
    "eval_transform",
    "evaluation_set",
    "expand_pattern",
    "find_images",
    "first_items",
    "folder_layout",
    "is_stream",
    "limited",
    "load_data",
    "load_images",
    "none_readable",
    "open_image",
    "parse_rand_augment",
    "read_image",
    "register_source",
    "source_named",
    "sources_help",
    "split_indices",
    "transformed",
    "unreadable_files",
    "write_shards",
]
