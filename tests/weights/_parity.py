"""Helpers of the converter tests: the parity tolerance, randomised weights (the suite's
`_helpers.randomize`), test images."""

from __future__ import annotations

import torch

from _helpers import randomize

__all__ = ["TOL", "images", "randomize", "randomize_far"]

# 1e-5 absolute, with torch.allclose's default 1e-5 relative term: vitkit's fused inference
# kernels sum in another order than the reference library, which moves ViT-B logits of
# magnitude ~3 by about 1e-5 (float32 rounding, not a conversion difference).
TOL = dict(atol=1e-5, rtol=1e-5)


def images(size: int | tuple[int, int], batch: int = 1, chans: int = 3) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, chans, h, w, generator=torch.Generator().manual_seed(1))


def randomize_far(model: torch.nn.Module) -> torch.nn.Module:
    """Weights far from any init (the Swin converter tests): norms around 1 but not 1, Swin V2
    logit scales up to e^3, other tensors N(0, 0.2) (vectors N(0, 0.5)); eval mode."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "logit_scale" in name:
                param.copy_(torch.rand(param.shape, generator=gen) * 3)
            elif "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.3 * noise)
            else:
                param.copy_(noise * (0.2 if param.ndim > 1 else 0.5))
    return model.eval()
