"""Helpers of the converter tests: the parity tolerance, randomised weights, test images."""

from __future__ import annotations

import torch

# 1e-5 absolute, with torch.allclose's default 1e-5 relative term: vitkit's fused inference
# kernels sum in another order than the reference library, which moves ViT-B logits of
# magnitude ~3 by about 1e-5 (float32 rounding, not a conversion difference).
TOL = dict(atol=1e-5, rtol=1e-5)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter so that no zero-initialised head or unit norm hides a mistake."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


def images(size: int | tuple[int, int], batch: int = 1, chans: int = 3) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, chans, h, w, generator=torch.Generator().manual_seed(1))
