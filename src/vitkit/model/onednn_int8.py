"""int8 Linear layers on oneDNN's quantised inner product (`precision.quantize_int8`).

`quantize_dynamic`'s Linear quantises its input, multiplies and dequantises to float32 in one
call, and nothing around it can be fused: on an AMX Xeon a whole ViT-S/16 ran at about
onnxruntime's int8 speed with it. `Int8Linear` computes the same dynamic
quantisation (weights int8 per output channel, symmetric; the input uint8 per tensor, with the
range of each call) on `torch.ops.onednn.qlinear_pointwise`, which writes bfloat16 or float32
and takes the block's GELU or residual add in its epilogue. In `OneDNNBlock` the qkv product
writes bf16 where the CPU has native bf16, so that attention runs at bf16 speed.

The operators are private to torch, and without VNNI or AMX oneDNN's int8 kernels saturate
(pairs of products summed in int16): both are checked once (`int8_unsupported_reason`), and
where either fails `precision.quantize_int8` falls back to `quantize_dynamic`.
"""

from __future__ import annotations

import functools
import math
import warnings
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .onednn_support import has_op

_REQUIRED_OPS = ("qlinear_prepack", "qlinear_pointwise", "qlinear_pointwise.binary")

# Each layer's weight packed for oneDNN (an opaque tensor that cannot be copied or saved), kept
# off the module so that deepcopy and state dicts see only the int8 buffers; dropped with it.
_PACKED: weakref.WeakKeyDictionary[nn.Module, tuple[Tensor, int, Tensor, Tensor]] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def int8_unsupported_reason() -> str:
    """Why this torch build cannot run `Int8Linear` ('' when it can): the oneDNN quantised
    operators and `torch.quantize_per_tensor` are looked up once."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    missing = [f"torch.ops.onednn.{name}" for name in _REQUIRED_OPS if not has_op("onednn", name)]
    if not hasattr(torch, "quantize_per_tensor"):
        missing.append("torch.quantize_per_tensor")
    if missing:
        return f"torch {torch.__version__} lacks {', '.join(missing)}"
    try:  # a build can list the operators and still lack the kernels (no x86 oneDNN)
        error = _saturation_error()
    except RuntimeError as failure:
        return f"oneDNN's int8 inner product does not run here ({str(failure).splitlines()[0]})"
    if error > 1e-5:
        return (
            "oneDNN's int8 products saturate on this CPU (no VNNI or AMX: pairs of uint8 x int8 "
            f"products are summed in int16; relative error {error:.2f} on a full-range test)"
        )
    return ""


def _saturation_error() -> float:
    """The relative error of a full-range product (inputs 255, weights 127) against float
    arithmetic: 0 with VNNI or AMX, ~0.5 where oneDNN's AVX2 / AVX-512 kernels sum pairs of
    products in int16 (which is why torch's 'x86' engine quantises inputs to 7 bits there)."""
    dense = nn.Linear(64, 8, bias=False)
    nn.init.ones_(dense.weight)
    layer = Int8Linear.from_float(dense)
    x = torch.full((4, 64), 255.0)
    x[:, 0] = 0.0  # the range [0, 255]: scale 1, zero point 0
    want = F.linear(x, layer.dequantized_weight())
    return ((layer(x) - want).abs().max() / want.abs().max()).item()


def quantize_activation(x: Tensor) -> tuple[Tensor, float, int] | None:
    """`x` as uint8 with one scale and zero point over its range (which always includes 0, so
    zero is exact): the dynamic quantisation of `quantize_dynamic`'s Linear. None where `x`
    holds inf or nan, which no range covers."""
    low, high = (value.item() for value in torch.aminmax(x))
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255 or 1.0  # all zeros: any scale
    zero_point = min(255, max(0, round(-low / scale)))
    return _to_uint8(x.float(), scale, zero_point), scale, zero_point


_DEPRECATION_SILENCED = False


def _to_uint8(x: Tensor, scale: float, zero_point: int) -> Tensor:
    """round(x / scale) + zero_point, clamped to uint8, in one kernel. torch warns once per
    process that quantised tensors are deprecated (>= 2.13); the first call takes that warning
    (a filter around every call would cost time on each product)."""
    global _DEPRECATION_SILENCED
    if _DEPRECATION_SILENCED:
        return torch.quantize_per_tensor(x, scale, zero_point, torch.quint8).int_repr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(x, scale, zero_point, torch.quint8)
    _DEPRECATION_SILENCED = True
    return q.int_repr()


class Int8Linear(nn.Module):
    """A Linear with int8 weights and dynamically quantised uint8 inputs on oneDNN's kernels;
    outputs in the input's dtype (bfloat16 or float32). Inference only; buffers, no parameters.

    `forward(x)` is the plain product; `OneDNNBlock` calls `forward_fused` with a post-op.
    An input that is not finite takes a float product of the dequantised weight, so that inf
    and nan propagate as in float32 rather than being clipped into the uint8 range.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_float(cls, layer: nn.Linear) -> Int8Linear:
        """The int8 layer of `layer`'s weights: symmetric per output channel, as
        `torch.ao.quantization.per_channel_dynamic_qconfig` quantises them."""
        weight = layer.weight.detach().float()
        int8 = cls(layer.in_features, layer.out_features, bias=layer.bias is not None)
        scale = weight.abs().amax(dim=1) / 127.5
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        int8.qweight = torch.round(weight / scale[:, None]).clamp(-128, 127).to(torch.int8)
        int8.weight_scale = scale
        if layer.bias is not None:
            int8.bias = layer.bias.detach().float().clone()
        return int8

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"

    def _weight(self) -> tuple[Tensor, Tensor]:
        """The weight packed into oneDNN's layout, once per weight tensor and version (a
        load_state_dict packs again), and its zero points (all 0: symmetric)."""
        weight = self.qweight
        # a tensor made under torch.inference_mode() has no version counter; load_state_dict
        # drops the entry below either way
        version = -1 if weight.is_inference() else weight._version
        cached = _PACKED.get(self)
        if cached is not None:
            source, packed_version, packed, zeros = cached
            if source is weight and packed_version == version:
                return packed, zeros
        packed = torch.ops.onednn.qlinear_prepack(weight, None)
        zeros = torch.zeros(self.out_features, dtype=torch.int64)
        _PACKED[self] = (weight, version, packed, zeros)
        return packed, zeros

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        _PACKED.pop(self, None)  # new weights: pack again
        super()._load_from_state_dict(*args, **kwargs)

    def dequantized_weight(self) -> Tensor:
        """The float32 weight the int8 one stands for."""
        return self.qweight.float() * self.weight_scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_fused(x)

    def forward_fused(
        self,
        x: Tensor,
        post_op: str = "none",
        residual: Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> Tensor:
        """x W^T + b in `out_dtype` (default x's), then `post_op` ('none' or 'gelu', exact) and
        `+ residual`, in the kernel's epilogue."""
        shape, out_dtype = x.shape, out_dtype or x.dtype
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:  # no range to quantise over
            out = x.new_zeros(*shape[:-1], self.out_features, dtype=out_dtype)
            return out if residual is None else out + residual
        quantized = quantize_activation(rows)
        if quantized is None:
            out = F.linear(rows.float(), self.dequantized_weight(), self.bias).to(out_dtype)
            out = F.gelu(out) if post_op == "gelu" else out
            out = out.view(*shape[:-1], self.out_features)
            return out if residual is None else out + residual
        q, scale, zero_point = quantized
        weight, zeros, bias = *self._weight(), self.bias
        algorithm = "none" if post_op == "gelu" else ""
        if residual is None:
            out = torch.ops.onednn.qlinear_pointwise(
                q,
                scale,
                zero_point,
                weight,
                self.weight_scale,
                zeros,
                bias,
                1.0,
                0,
                out_dtype,
                post_op,
                [],
                algorithm,
            )
        else:
            other = residual.reshape(-1, self.out_features)
            out = torch.ops.onednn.qlinear_pointwise.binary(
                q,
                scale,
                zero_point,
                weight,
                self.weight_scale,
                zeros,
                other,
                bias,
                1.0,
                0,
                out_dtype,
                1.0,
                0,
                "add",
                1.0,
                post_op,
                [],
                algorithm,
            )
        return out.view(*shape[:-1], self.out_features)
