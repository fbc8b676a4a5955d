"""Weights pretrained on one number of image channels fitted to a model of another: grey
images (digits, MNIST) on RGB weights, RGB on grey weights, multispectral bands.

The first convolution is adapted as timm's `adapt_input_conv` does when `create_model(...,
in_chans=N, pretrained=True)` loads weights (`model.layers.patch_embed.adapt_input_conv`):
for one channel its kernels are summed, so a grey image gives what the original gave on the
image repeated to every channel; for N channels they are repeated and scaled by base / N. The
family's record names which weight is its first convolution (`WeightsFamily.input_conv`: the
patch projection, or the stem of the paper's hybrids); the data config's mean and std follow
the same map (`DataConfig.for_channels`).
"""

from __future__ import annotations

import dataclasses
import logging

from torch import Tensor

from ..model.layers.patch_embed import adapt_input_conv
from .checkpoint import CheckpointError
from .source import SourceWeights

log = logging.getLogger(__name__)


def adapt_channels(weights: SourceWeights, in_chans: int, input_conv: str) -> SourceWeights:
    """`weights` for a model of `in_chans` input channels: the weight `input_conv` (a state
    dict key) adapted as timm's `adapt_input_conv`, the config's and the data config's channels
    with it; said in one log line."""
    base = weights.config.in_chans
    if in_chans == base:
        return weights
    if input_conv not in weights.state_dict:
        raise CheckpointError(
            f"{weights.name} has no {input_conv} to adapt from {base} to {in_chans} channels"
        )
    state_dict = dict(weights.state_dict)
    state_dict[input_conv] = _adapted(state_dict[input_conv], in_chans, base)
    how = (
        f"summed over its {base} channels"
        if in_chans == 1
        else f"repeated to {in_chans} channels and scaled by {base}/{in_chans}"
    )
    log.info(
        "the weights take %d-channel images, the model %d: %s %s as timm's adapt_input_conv",
        base,
        in_chans,
        input_conv.removesuffix(".weight"),
        how,
    )
    data_config = weights.data_config and weights.data_config.for_channels(in_chans)
    return dataclasses.replace(
        weights,
        state_dict=state_dict,
        config=weights.config.replace(in_chans=in_chans),
        data_config=data_config,
    )


def _adapted(weight: Tensor, in_chans: int, base: int) -> Tensor:
    """A Conv2d weight (O, I, kh, kw) adapted; a linear patch projection (D, C*ph*pw), whose
    inputs are channel-major (`unfold_to_conv_weight`), as the convolution it stands for."""
    if weight.ndim == 2:  # (D, C*ph*pw) -> (D, C, ph*pw, 1) and back
        conv = weight.reshape(weight.shape[0], base, -1, 1)
        return adapt_input_conv(in_chans, conv, base).reshape(weight.shape[0], -1)
    try:
        return adapt_input_conv(in_chans, weight, base)
    except NotImplementedError as err:
        raise CheckpointError(
            f"cannot adapt the first convolution from {base} to {in_chans} channels: {err}"
        ) from None
