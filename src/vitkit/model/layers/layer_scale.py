"""LayerScale: Touvron et al., "Going deeper with Image Transformers" (CaiT, ICCV 2021), a
learned per-channel scale on each residual branch, started small."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT), initialised to `init_values`."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), init_values))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma
