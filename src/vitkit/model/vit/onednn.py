"""The CPU fast path: oneDNN kernels in a model's encoder blocks, chosen when it is built.

A reader of the model can skip this module: `layers/` is the paper, and this file only makes
the same function faster on CPUs. Where torch can run the kernels, `layer_classes()` gives the
model builder `OneDNNBlock` for `Block` and `OneDNNLinear` for the Linear layers of attention and
MLP: subclasses with the same parameters, keys and hooks, whose `forward` takes the kernels when
they apply and is the plain layer's otherwise (and under TorchScript). torch.fx records each
as one call (`onednn_support.record_as_leaf`), so a traced model runs what the eager model runs,
bit for bit; with the fast path off, fx traces through them.

- `OneDNNLinear` (`model/onednn_linear.py`, shared): the forward product and the input
  gradient on oneDNN's inner product, the weight gradient on `torch.mm` (float32 on CPU,
  training included).
- `OneDNNBlock`: in eval mode with grad off, oneDNN GEMMs with the bias, GELU and residual add
  fused in, on weights packed once into oneDNN's layout, plus SDPA attention, in cache-sized
  slices of whole images; float32, or bf16 where the CPU has native bf16. Only for blocks made
  of the layers on `FUSED_LAYERS`, an allow-list of what the fused kernels compute (sub-module
  name -> exact classes): a layer not on it (a new attention variant, a norm subclass, a
  wrapper, a module added) sends the block down the plain path, with the reason
  (`fast_path_blocker`), so a new variant is never skipped silently. The kernels, the checks,
  the allow-list walk and the switch are shared with the other families' fused blocks
  (`model/onednn_fused.py`); this file holds the ViT block's function and its list.

`enable_fast_path` (`VisionTransformer.set_fast_path`) sets their `fast_path` flag and options,
as timm's `fused_attn`; no class changes after construction. The private torch APIs they
call are looked up once (`onednn_support.py`): where one is missing the model is built with
the plain layers, so a torch upgrade can cost speed but never break the model. Every call checks
that nothing needs the plain layers to run (training, autograd, hooks, autocast other than
bf16, dispatch modes, tensor subclasses, tracing, compiling, dtype, device), so outputs and
gradients always equal the plain path's (bf16 autocast: within bf16 rounding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import Attention, Block, Mlp
from ..onednn_fused import (
    _PACKED,
    EVAL_IDENTITY,
    LINEARS,
    NORMS,
    SLICE_BYTES,
    FusedBlock,
    disable_fast_path,
    enable_fast_path,
    fast_path_in_use,
    fused_norm,
    fused_slices,
    linear,
    linear_add,
    linear_gelu,
    log_fast_path,
)
from ..onednn_fused import unfused_layer as unfused_in
from ..onednn_int8 import Int8Linear
from ..onednn_linear import OneDNNLinear
from ..onednn_support import (
    default_gelu_in_epilogue,
    native_bf16,
    record_as_leaf,
    unsupported_reason,
)

__all__ = [
    "FUSED_LAYERS",
    "SLICE_BYTES",
    "_PACKED",
    "OneDNNBlock",
    "OneDNNLinear",
    "disable_fast_path",
    "enable_fast_path",
    "fast_path_in_use",
    "fused_slices",
    "layer_classes",
    "log_fast_path",
    "unfused_layer",
    "unsupported_reason",
]

# -- the fused inference block ---------------------------------------------------------------


class OneDNNBlock(FusedBlock, Block):
    """`Block` whose `forward`, in eval mode with grad disabled on CPU, takes a fused inference
    path whenever `fast_path_blocker` finds nothing against it, and `Block.forward` otherwise.

    Args:
        dim, **options: `Block`'s (the builder passes `linear_layer=OneDNNLinear`).
        gelu_in_epilogue: run fc1's GELU in oneDNN's epilogue; None asks the CPU
            (`default_gelu_in_epilogue`).
        slice_bytes: the budget of `fused_slices`.
    """

    __jit_unused_properties__ = ["int8"]  # TorchScript compiles the plain path only

    def __init__(
        self,
        dim: int,
        *,
        gelu_in_epilogue: bool | None = None,
        slice_bytes: int = SLICE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(dim, **options)
        self._init_fast_path(gelu_in_epilogue, slice_bytes)

    @property
    def int8(self) -> bool:
        """Whether the block's Linear layers are int8 (`precision.quantize_int8`)."""
        return isinstance(self.attn.qkv, Int8Linear)

    def unfused_layer(self) -> str:
        return unfused_layer(self)

    def fused_weight(self) -> Tensor:
        # an int8 block computes in float32 (its weight scales' dtype), as the model's input
        return self.attn.qkv.weight_scale if self.int8 else self.attn.qkv.weight

    def fused_hidden(self) -> int:
        return self.mlp.fc1.out_features

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript compiles the plain block below
            if self.fast_path and isinstance(x, torch.fx.Proxy):
                leaf = record_as_leaf(self, x)  # torch.fx: one call to this block
                if leaf is not None:
                    return leaf
            if not self.fast_path_blocker(x):
                return self.run_fused(x)
        # `Block.forward`, restated: TorchScript compiles no `super()` call.
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def _attention_dtype(self, x: Tensor) -> torch.dtype:
        """The dtype attention runs in: x's, except in an int8 block on a CPU with native bf16,
        where the qkv product writes bf16 for SDPA at bf16 speed (2x float32's; the residual
        stream, norms and MLP stay float32: an all-bf16 int8 block ran 0.8x, its extra casts
        and quantisation passes costing more than they saved)."""
        return torch.bfloat16 if self.int8 and native_bf16() else x.dtype

    def _fused_slice(self, x: Tensor) -> Tensor:
        attn, in_epilogue = self.attn, self.gelu_in_epilogue
        if in_epilogue is None:
            in_epilogue = default_gelu_in_epilogue()
        qkv = linear(fused_norm(self.norm1, x), attn.qkv, self._attention_dtype(x))
        q, k, v = attn.split_heads(qkv)  # (B, heads, N, head_dim)
        h = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)  # (B, heads, N, head_dim)
        x = linear_add(attn.merge_heads(h), attn.proj, x)  # (B, N, D)
        h = linear_gelu(fused_norm(self.norm2, x), self.mlp.fc1, in_epilogue)  # (B, N, hidden)
        return linear_add(h, self.mlp.fc2, x)


# -- what the fused kernels implement: an allow-list -------------------------------------------

# Every sub-module of a block the fused path runs, by its name in the block, and the exact
# classes (not subclasses: a subclass may compute something else) it may be there: the fused
# kernels compute norm1 -> attn.qkv -> SDPA -> attn.proj + x -> norm2 -> mlp.fc1 -> exact GELU
# -> mlp.fc2 + x, and nothing else. A sub-module not listed (a new layer, rotary positions, a
# wrapper), a class not listed (LayerScale, q/k norm, another MLP or activation, a norm
# subclass) or a slot missing sends the block down the plain path, which runs the layers.
FUSED_LAYERS: dict[str, tuple[type[nn.Module], ...]] = {
    "": (OneDNNBlock,),
    "norm1": NORMS,
    "attn": (Attention,),
    "attn.qkv": LINEARS,
    "attn.q_norm": (nn.Identity,),
    "attn.k_norm": (nn.Identity,),
    "attn.attn_drop": EVAL_IDENTITY,
    "attn.norm": (nn.Identity,),
    "attn.proj": LINEARS,
    "attn.proj_drop": EVAL_IDENTITY,
    "ls1": (nn.Identity,),
    "drop_path1": EVAL_IDENTITY,
    "norm2": NORMS,
    "mlp": (Mlp,),
    "mlp.fc1": LINEARS,
    "mlp.act": (nn.GELU,),
    "mlp.drop1": EVAL_IDENTITY,
    "mlp.norm": (nn.Identity,),
    "mlp.fc2": LINEARS,
    "mlp.drop2": EVAL_IDENTITY,
    "ls2": (nn.Identity,),
    "drop_path2": EVAL_IDENTITY,
}


def unfused_layer(block: nn.Module) -> str:
    """Why the fused kernels do not compute `block` ('' when they do), against
    `FUSED_LAYERS` (`onednn_fused.unfused_layer`)."""
    return unfused_in(block, FUSED_LAYERS)


# -- the choice at build time ------------------------------------------------------------------


def layer_classes() -> tuple[type[Block], type[nn.Linear]]:
    """The classes a model builder uses for its pre-norm blocks and for the Linear layers of
    attention and MLP: `OneDNNBlock` and `OneDNNLinear` where this torch build can run them,
    `Block` and `nn.Linear` otherwise (`unsupported_reason` says why)."""
    if unsupported_reason():
        return Block, nn.Linear
    return OneDNNBlock, OneDNNLinear
