"""The truncated-normal initialiser the ViT paper's models start from (timm's `trunc_normal_`,
as in Dosovitskiy et al., ICLR 2021), written for speed on CPU."""

from __future__ import annotations

import math

import torch
from torch import Tensor


@torch.no_grad()
def trunc_normal_(tensor: Tensor, std: float = 0.02) -> Tensor:
    """Normal(0, std) truncated at two standard deviations, by inverse-CDF sampling.

    The same distribution as `nn.init.trunc_normal_`, written in place in one pass: PyTorch's
    version is an order of magnitude slower on CPU, which dominates building large models.
    """
    bound = math.erf(2 / math.sqrt(2))  # erf-space image of [-2 std, 2 std]
    tensor.uniform_(-bound, bound).erfinv_().mul_(std * math.sqrt(2.0))
    return tensor.clamp_(-2 * std, 2 * std)
