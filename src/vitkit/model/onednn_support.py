"""What this torch build and CPU offer the CPU fast path (`onednn.py`) and bf16 inference
(`precision.py`), asked once: the private torch APIs the fast path calls may be renamed or
removed by any torch release, so each is looked up here and a missing one named."""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

try:  # private; unsupported_reason() reports it missing
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # pragma: no cover - depends on the torch version
    _get_current_dispatch_mode = None

# The oneDNN operators the fast path calls (`name.overload` for an overload), in torch.ops.mkldnn.
_REQUIRED_OPS = (
    "_linear_pointwise",
    "_linear_pointwise.binary",
    "_reorder_linear_weight",
    "_is_mkldnn_bf16_supported",
)


def has_op(namespace: str, name: str) -> bool:
    """Whether `torch.ops.<namespace>.<name>` exists (`name` may be `op.overload`)."""
    op, _, overload = name.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        if overload:
            getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache
def unsupported_reason() -> str:
    """Why this torch build cannot run the fast path ('' when it can), checked once: the
    private APIs it calls may be renamed or removed by any torch release."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    missing = [f"torch.ops.mkldnn.{name}" for name in _REQUIRED_OPS if not has_op("mkldnn", name)]
    if _get_current_dispatch_mode is None:
        missing.append("torch.utils._python_dispatch._get_current_dispatch_mode")
    if not hasattr(torch._C, "_are_functorch_transforms_active"):
        missing.append("torch._C._are_functorch_transforms_active")
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks"):
        if not hasattr(nn.modules.module, name):
            missing.append(f"torch.nn.modules.module.{name}")
    if not hasattr(Tensor, "_version"):
        missing.append("torch.Tensor._version")
    if missing:
        return f"torch {torch.__version__} lacks {', '.join(missing)}"
    return ""


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (oneDNN's bf16 kernels: AVX-512 BF16 or
    AMX). Asked of a private torch op; a torch without it answers False."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def default_gelu_in_epilogue() -> bool:
    """Whether the fused path runs fc1's GELU in oneDNN's GEMM epilogue (True) or in place after
    the product. The epilogue's erf is slow without AVX-512: on an AVX2 CPU it held fc1 to
    ~106 GFLOP/s against ~130 for the product followed by `gelu_` (ViT-B/16, 2 threads)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def record_as_leaf(module: nn.Module, x: torch.fx.Proxy, *args: object) -> torch.fx.Proxy | None:
    """Record `module(x, *args)` as one call in the graph torch.fx is tracing, as fx records
    torch.nn's own layers; None where it cannot (`module` is the root being traced, or not
    under it).

    The traced model then calls the module, which chooses its kernels as the eager model does,
    so both compute the same bits; tracing through it would record the plain path, whose
    products sum in another order."""
    tracer = x.tracer
    if getattr(tracer, "root", None) is module:
        return None
    try:
        path = tracer.path_of_module(module)
    except NameError:  # a module outside the traced root
        return None
    return tracer.create_proxy("call_module", path, (x, *args), {})


def dispatch_mode() -> object | None:
    """The active torch dispatch mode (e.g. FlopCounterMode), if any. Call only where
    `unsupported_reason()` is empty: the private function it asks then exists."""
    return _get_current_dispatch_mode()
