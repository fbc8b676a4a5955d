"""Stochastic depth: Huang et al., "Deep Networks with Stochastic Depth" (ECCV 2016), as DeiT
and timm apply it to each residual branch of a transformer block."""

from __future__ import annotations

from torch import Tensor, nn


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch for a whole sample with probability `p`."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"
