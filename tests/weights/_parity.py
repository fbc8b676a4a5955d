"""Helpers of the converter tests: the parity tolerance, randomised weights (the suite's
`_helpers.randomize`), test images."""

from __future__ import annotations

import torch

from _helpers import randomize

__all__ = ["TOL", "images", "randomize"]

# 1e-5 absolute, with torch.allclose's default 1e-5 relative term: vitkit's fused inference
# kernels sum in another order than the reference library, which moves ViT-B logits of
# magnitude ~3 by about 1e-5 (float32 rounding, not a conversion difference).
TOL = dict(atol=1e-5, rtol=1e-5)


def images(size: int | tuple[int, int], batch: int = 1, chans: int = 3) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, chans, h, w, generator=torch.Generator().manual_seed(1))
