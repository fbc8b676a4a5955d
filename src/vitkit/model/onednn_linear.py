"""`OneDNNLinear`: an `nn.Linear` whose product runs on oneDNN's inner-product kernel on CPU.

Shared by every family whose builder asks for it (the ViT's fast path, `vit/onednn.py`) and by
`precision.py`, which quantises it as the `nn.Linear` it is. The private operator it calls is
looked up once (`onednn_support.unsupported_reason`); without it the layer is `F.linear`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .onednn_support import dispatch_mode, record_as_leaf, unsupported_reason

# Narrower products are too small to repay the custom kernel's per-call costs (measured: a
# 128-wide encoder trained at 0.97x, a 192-wide one at 1.11x).
MIN_FEATURES = 192


def _onednn_linear_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether `OneDNNLinear` may call oneDNN: a float32 CPU input with nothing that needs to
    see (or cannot trace) the kernel: autocast, compiling or tracing, a dispatch mode such as
    FlopCounterMode, a tensor subclass, a torch.func transform."""
    return (
        not torch.compiler.is_compiling()  # first: the compiler must not trace the rest
        and not torch.jit.is_tracing()
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not unsupported_reason()
        and not torch.is_autocast_enabled("cpu")
        and dispatch_mode() is None
        and not torch.overrides.has_torch_function((x,))
        and not torch._C._are_functorch_transforms_active()
    )


def onednn_inner_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _InnerProduct(torch.autograd.Function):
    """x W^T + b, forward and input gradient by oneDNN's inner product, weight gradient by
    torch.mm: the products MKL computes slowest on some CPUs go to oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        return onednn_inner_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # e.g. the qkv gradient arrives permuted
        rows = grad.view(-1, grad.shape[-1])  # (tokens, out_features)
        need_x, need_weight, need_bias = ctx.needs_input_grad
        grad_x = None
        if need_x and torch.is_grad_enabled():  # create_graph=True: differentiable ops
            grad_x = grad @ weight
        elif need_x:
            grad_x = onednn_inner_product(grad, weight.t().contiguous(), None)  # W^T: (in, out)
        grad_weight = None
        if need_weight:
            inputs = x.reshape(-1, x.shape[-1])  # (tokens, in_features)
            grad_weight = rows.t().mm(inputs)  # (out_features, in_features)
        grad_bias = rows.sum(0) if need_bias else None
        return grad_x, grad_weight, grad_bias


class OneDNNLinear(nn.Linear):
    """`nn.Linear` whose product runs on oneDNN's inner-product kernel for float32 CPU inputs,
    in the forward and the input gradient (~1.3x MKL's GEMM on an AVX-512 AMD CPU, ~1.1-1.2x a
    whole ViT training step; ~1.1-1.2x the GEMM on an AVX2 one); anywhere else, for layers
    narrower than `min_features`, with `fast_path` off, and when TorchScript compiles it, it is
    `F.linear`. torch.fx records it as one call, as it records an `nn.Linear`, so the traced
    model runs the same kernel. Same parameters, state-dict keys and hooks as `nn.Linear`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # nn.Linear's arguments
        super().__init__(*args, **kwargs)
        self.fast_path = True  # `enable_fast_path` switches it
        self.min_features = MIN_FEATURES

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript compiles F.linear below
            if self.fast_path and isinstance(x, torch.fx.Proxy):
                leaf = record_as_leaf(self, x)  # torch.fx: one call, as for an nn.Linear
                if leaf is not None:
                    return leaf
            elif self.fast_path:
                narrow = min(self.in_features, self.out_features) < self.min_features
                if not narrow and _onednn_linear_applies(x, self.weight):
                    return _InnerProduct.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
