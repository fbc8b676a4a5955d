"""Images converted to another number of channels, as Pillow converts them: grey repeated to
RGB, RGB to grey by ITU-R 601-2 luma (`Image.convert('L')`).

Image files are decoded to the channels asked for (`images.py`); this converts the images of
sources whose channels are fixed (the digits, MNIST, Fashion-MNIST tensors), for `vitkit train
--pretrained RGB-WEIGHTS --in-chans 3` on grey data: the images made RGB, as timm's loaders
convert them, instead of the weights' first convolution adapted to one channel (the default,
`weights/channels.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from .data_config import channel_stats
from .datasets import Splits
from .streams import transformed

# ITU-R 601-2 luma, the weights of Pillow's convert('L').
LUMA = (0.299, 0.587, 0.114)


def convert_channels(image: Tensor | Image.Image, in_chans: int) -> Any:
    """`image` (a (C, H, W) tensor or a PIL image) with `in_chans` channels (1 or 3)."""
    if isinstance(image, Image.Image):
        return image if len(image.getbands()) == in_chans else image.convert(_MODES[in_chans])
    chans = image.shape[-3]
    if chans == in_chans:
        return image
    if chans == 1:  # (1, H, W) -> (in_chans, H, W)
        return image.repeat(in_chans, 1, 1)
    if chans == 3 and in_chans == 1:  # (3, H, W) -> (1, H, W)
        luma = torch.tensor(LUMA, dtype=image.dtype).view(3, 1, 1)
        return (image * luma).sum(dim=0, keepdim=True)
    raise ValueError(f"cannot convert {chans}-channel images to {in_chans} channels")


_MODES = {1: "L", 3: "RGB"}


def with_channels(splits: Splits, in_chans: int) -> Splits:
    """`splits` whose images come converted to `in_chans` channels (`convert_channels`), their
    mean and std mapped as the channels are."""
    if in_chans == splits.in_chans:
        return splits
    convert = functools.partial(convert_channels, in_chans=in_chans)
    return dataclasses.replace(
        splits,
        train=transformed(splits.train, convert),
        val=transformed(splits.val, convert),
        test=transformed(splits.test, convert),
        in_chans=in_chans,
        mean=channel_stats(splits.mean, in_chans),
        std=channel_stats(splits.std, in_chans),
    )
