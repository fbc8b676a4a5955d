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
  (`fast_path_blocker`), so a new variant is never skipped silently.

`enable_fast_path` (`VisionTransformer.set_fast_path`) sets their `fast_path` flag and options,
as timm's `fused_attn`; no class changes after construction. The private torch APIs they
call are looked up once (`onednn_support.py`): where one is missing the model is built with
the plain layers, so a torch upgrade can cost speed but never break the model. Every call checks
that nothing needs the plain layers to run (training, autograd, hooks, autocast other than
bf16, dispatch modes, tensor subclasses, tracing, compiling, dtype, device), so outputs and
gradients always equal the plain path's (bf16 autocast: within bf16 rounding).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import Attention, Block, DropPath, Mlp
from ..onednn_int8 import Int8Linear
from ..onednn_linear import MIN_FEATURES, OneDNNLinear, onednn_inner_product
from ..onednn_support import (
    default_gelu_in_epilogue,
    dispatch_mode,
    native_bf16,
    record_as_leaf,
    unsupported_reason,
)

logger = logging.getLogger(__name__)

# The fused path runs a batch in slices of whole images whose widest activation (the MLP's
# hidden layer) stays under this many bytes, so each kernel's output is still in the last-level
# cache when the next kernel reads it: ~5% faster on ViT-B/16 at batch 32 (4 slices) and ViT-S/16
# (2 slices) on a 2-core, 32 MiB-L3 machine, with identical outputs (rows are independent); on a
# 16 MiB-L3 one, 24 MiB still beat 12 and 6 MiB and unsliced batches.
SLICE_BYTES = 24 * 2**20

# -- the fused inference block ---------------------------------------------------------------


def _global_forward_hooks() -> bool:
    """Whether a global forward (pre-)hook would run (those of sub-modules: `unfused_layer`)."""
    return bool(
        nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    )


# oneDNN-packed copies of the fused path's Linear weights, per layer and compute dtype: kept
# off the module (no state-dict entry; deepcopy and pickle never see them) and dropped with it.
_PACKED: weakref.WeakKeyDictionary[nn.Linear, dict[torch.dtype, tuple[Tensor, int, Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def _packed_weight(layer: nn.Linear, tokens: int, dtype: torch.dtype) -> Tensor:
    """`layer.weight` in `dtype` (bf16 under autocast), reordered into oneDNN's blocked layout
    once rather than in every call (~10% of ViT-S inference); packed again when the weight
    changes (an in-place update, new data, another dtype). The entry holds a view of the weight
    it packed, so that memory cannot be reused by another weight while the entry lives."""
    weight = layer.weight
    if weight.is_inference():
        # Made under torch.inference_mode(): no version counter tells in-place updates (such as
        # load_state_dict's) apart, so a cached copy could go stale; pack in every call.
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), tokens)
    cached = _PACKED.setdefault(layer, {}).get(dtype)
    if cached is not None:
        source, version, packed = cached
        if (
            source.data_ptr() == weight.data_ptr()
            and source.dtype == weight.dtype
            and source.shape == weight.shape
            and version == weight._version
        ):
            return packed
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), tokens)
    _PACKED[layer][dtype] = (weight.detach(), weight._version, packed)
    return packed


def fused_slices(batch: int, tokens: int, hidden: int, itemsize: int, budget: int) -> int:
    """How many slices of whole images the fused path cuts a batch into, so that each slice's
    MLP hidden activation stays under `budget` bytes."""
    hidden_bytes = batch * tokens * hidden * itemsize
    return max(1, min(batch, -(-hidden_bytes // budget)))


def _weight_bias(x: Tensor, layer: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """The packed weight and the bias in `x`'s dtype (bf16 under autocast)."""
    bias = layer.bias
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return _packed_weight(layer, x.shape[0] * x.shape[1], x.dtype), bias


def _linear(
    x: Tensor, layer: nn.Linear | Int8Linear, out_dtype: torch.dtype | None = None
) -> Tensor:
    """x W^T + b with oneDNN's inner-product kernel (faster than MKL's addmm here); an int8
    layer writes `out_dtype` (default x's)."""
    if isinstance(layer, Int8Linear):
        return layer.forward_fused(x, out_dtype=out_dtype)
    return onednn_inner_product(x, *_weight_bias(x, layer))


def _linear_gelu(x: Tensor, layer: nn.Linear | Int8Linear, in_epilogue: bool) -> Tensor:
    """GELU(x W^T + b): oneDNN's product, the GELU in its epilogue or in place after it."""
    if isinstance(layer, Int8Linear):
        return layer.forward_fused(x, "gelu")
    if not in_epilogue:
        return torch.ops.aten.gelu_(_linear(x, layer))
    weight, bias = _weight_bias(x, layer)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")


def _linear_add(x: Tensor, layer: nn.Linear | Int8Linear, residual: Tensor) -> Tensor:
    """residual + (x W^T + b) in one oneDNN kernel (the residual add runs in the epilogue)."""
    if isinstance(layer, Int8Linear):
        return layer.forward_fused(x, residual=residual, out_dtype=residual.dtype)
    weight, bias = _weight_bias(x, layer)
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")


def _fused_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype the fused kernels would compute in: the input's, or bf16 under bf16 autocast
    over float32 weights; None under any other autocast."""
    if not torch.is_autocast_enabled("cpu"):
        return x.dtype
    if torch.get_autocast_dtype("cpu") == torch.bfloat16 and weight.dtype == torch.float32:
        return torch.bfloat16
    return None


def _norm(norm: nn.Module, x: Tensor) -> Tensor:
    """`norm(x)` in x's dtype where the norm's weights are float32 (bf16 autocast): LayerNorm
    takes mixed dtypes (computing in float32); other norms run on float32 and are cast back."""
    weight = getattr(norm, "weight", None)
    if weight is None or weight.dtype == x.dtype or isinstance(norm, nn.LayerNorm):
        return norm(x)
    return norm(x.float()).to(x.dtype)


class OneDNNBlock(Block):
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
        self.fast_path = True  # `enable_fast_path` switches it
        if gelu_in_epilogue is None:
            gelu_in_epilogue = default_gelu_in_epilogue()
        self.gelu_in_epilogue = gelu_in_epilogue
        self.slice_bytes = slice_bytes

    def train(self, mode: bool = True) -> OneDNNBlock:
        """Entering training drops the packed weights: an optimiser may update them in ways
        no version counter records (torch's fused AdamW does not bump it), so they are
        packed afresh at the next inference."""
        if mode:
            for layer in self.modules():
                _PACKED.pop(layer, None)
        return super().train(mode)

    def fast_path_blocker(self, x: Tensor) -> str:
        """Why `forward(x)` takes the plain path rather than the fused one ('' if it does not).

        The fused path computes the same function without running the sub-modules, so it is
        left whenever something needs them to run: training, autograd, hooks (e.g.
        `vitkit.summary`), a dispatch mode (e.g. FlopCounterMode), tracing or compiling.
        """
        if isinstance(x, torch.fx.Proxy) or torch.jit.is_tracing():
            return "tracing (torch.fx or torch.jit.trace record the plain block)"
        if torch.compiler.is_compiling():
            return "compiling (the compiler does its own fusion)"
        if not self.fast_path:
            return "the fast path is switched off (set_fast_path(False))"
        unsupported = unsupported_reason()
        if unsupported:
            return unsupported
        if self.training:
            return "the block is in training mode"
        if torch.is_grad_enabled():
            return "grad is enabled; run under torch.inference_mode() or torch.no_grad()"
        unfused = unfused_layer(self)
        if unfused:
            return unfused
        if x.device.type != "cpu":
            return f"the fused kernels are oneDNN's (CPU); the input is on {x.device.type}"
        # an int8 block computes in float32 (its weight scales' dtype), as the model's input
        weight = self.attn.qkv.weight_scale if self.int8 else self.attn.qkv.weight
        dtype = _fused_dtype(x, weight)
        if dtype is None:
            return (
                f"autocast to {torch.get_autocast_dtype('cpu')} over {weight.dtype} weights "
                "(only bf16 autocast over float32 weights is fused)"
            )
        if x.ndim != 3 or (x.dtype != weight.dtype and not torch.is_autocast_enabled("cpu")):
            return f"input {x.dtype} {x.ndim}-D does not match 3-D {weight.dtype} weights"
        if dtype not in (torch.float32, torch.bfloat16) or (
            dtype == torch.bfloat16 and not native_bf16()
        ):
            return f"oneDNN has no fast {dtype} kernel on this CPU"
        if dispatch_mode() is not None or torch.overrides.has_torch_function((x,)):
            return "a dispatch mode or tensor subclass is active"
        if _global_forward_hooks():
            return "global forward hooks are registered (they must see every layer run)"
        return ""

    @property
    def int8(self) -> bool:
        """Whether the block's Linear layers are int8 (`precision.quantize_int8`)."""
        return isinstance(self.attn.qkv, Int8Linear)

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript compiles the plain block below
            if self.fast_path and isinstance(x, torch.fx.Proxy):
                leaf = record_as_leaf(self, x)  # torch.fx: one call to this block
                if leaf is not None:
                    return leaf
            if not self.fast_path_blocker(x):
                if torch.is_autocast_enabled("cpu"):  # bf16 kernels on float32 weights
                    with torch.autocast("cpu", enabled=False):
                        return self.forward_fused(x.to(torch.bfloat16)).to(x.dtype)
                return self.forward_fused(x)
        # `Block.forward`, restated: TorchScript compiles no `super()` call.
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def forward_fused(self, x: Tensor) -> Tensor:
        """Inference-only `forward` with fused oneDNN kernels; dropout and drop-path are the
        identity in eval mode, so the function is the same. Call through `forward`, which
        checks that it applies. Large batches run in cache-sized slices (`fused_slices`)."""
        batch, tokens, _ = x.shape
        hidden = self.mlp.fc1.out_features
        slices = fused_slices(batch, tokens, hidden, x.element_size(), self.slice_bytes)
        if slices == 1:
            return self._fused_slice(x)
        return torch.cat([self._fused_slice(part) for part in x.tensor_split(slices)])

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
        qkv = _linear(_norm(self.norm1, x), attn.qkv, self._attention_dtype(x))
        q, k, v = attn.split_heads(qkv)  # (B, heads, N, head_dim)
        h = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)  # (B, heads, N, head_dim)
        x = _linear_add(attn.merge_heads(h), attn.proj, x)  # (B, N, D)
        h = _linear_gelu(_norm(self.norm2, x), self.mlp.fc1, in_epilogue)  # (B, N, hidden)
        return _linear_add(h, self.mlp.fc2, x)


# -- what the fused kernels implement: an allow-list -------------------------------------------

# Linear layers whose product `_linear` computes (oneDNN's float kernel, or the int8 one).
_LINEARS: tuple[type[nn.Module], ...] = (nn.Linear, OneDNNLinear, Int8Linear)
_NORMS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)  # run as modules (`_norm`)
_EVAL_IDENTITY: tuple[type[nn.Module], ...] = (nn.Identity, nn.Dropout, DropPath)
# The allowed layers that compute something else in training mode (dropout): the fused path
# leaves a block where one of them is (e.g. `block.attn.train()` in an eval model).
_TRAINING_DIFFERS: tuple[type[nn.Module], ...] = (nn.Dropout, DropPath, Attention)

# Every sub-module of a block the fused path runs, by its name in the block, and the exact
# classes (not subclasses: a subclass may compute something else) it may be there: the fused
# kernels compute norm1 -> attn.qkv -> SDPA -> attn.proj + x -> norm2 -> mlp.fc1 -> exact GELU
# -> mlp.fc2 + x, and nothing else. A sub-module not listed (a new layer, rotary positions, a
# wrapper), a class not listed (LayerScale, q/k norm, another MLP or activation, a norm
# subclass) or a slot missing sends the block down the plain path, which runs the layers.
FUSED_LAYERS: dict[str, tuple[type[nn.Module], ...]] = {
    "": (OneDNNBlock,),
    "norm1": _NORMS,
    "attn": (Attention,),
    "attn.qkv": _LINEARS,
    "attn.q_norm": (nn.Identity,),
    "attn.k_norm": (nn.Identity,),
    "attn.attn_drop": _EVAL_IDENTITY,
    "attn.norm": (nn.Identity,),
    "attn.proj": _LINEARS,
    "attn.proj_drop": _EVAL_IDENTITY,
    "ls1": (nn.Identity,),
    "drop_path1": _EVAL_IDENTITY,
    "norm2": _NORMS,
    "mlp": (Mlp,),
    "mlp.fc1": _LINEARS,
    "mlp.act": (nn.GELU,),
    "mlp.drop1": _EVAL_IDENTITY,
    "mlp.norm": (nn.Identity,),
    "mlp.fc2": _LINEARS,
    "mlp.drop2": _EVAL_IDENTITY,
    "ls2": (nn.Identity,),
    "drop_path2": _EVAL_IDENTITY,
}
_LINEAR_SLOTS = [name for name, allowed in FUSED_LAYERS.items() if allowed is _LINEARS]


def _unfused_setting(name: str, module: nn.Module) -> str:
    """What an allowed layer is set to that the fused kernels do not compute ('' if nothing)."""
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"{name} is GELU(approximate={module.approximate!r}); the fused one is exact"
    if isinstance(module, Attention) and not module.fused_attn:
        return f"{name}.fused_attn is False (explicit attention requested)"
    name = name or "the block"
    if "forward" in vars(module):
        return f"{name} has a forward of its own (set on the instance)"
    if module.training and isinstance(module, _TRAINING_DIFFERS):
        return f"{name} is in training mode"
    if module._forward_hooks or module._forward_pre_hooks:
        return f"{name} has forward hooks (they must see it run)"
    return ""


def _not_allowed(name: str, cls: type, allowed: tuple[type, ...] | None) -> str:
    """The reason a `cls` at `name` is not fused; its module is named where an allowed class
    has the same name (torch's quantised Linear is also `Linear`)."""
    if allowed is None:
        return f"{name} ({cls.__qualname__}) is not a layer the fused kernels implement"
    found = cls.__qualname__
    if any(other.__qualname__ == found for other in allowed):
        found = f"{cls.__module__}.{found}"
    names = ", ".join(other.__qualname__ for other in allowed)
    return f"{name or 'the block'} is a {found}, not one the fused kernels implement ({names})"


def unfused_layer(block: nn.Module) -> str:
    """Why the fused kernels do not compute `block` ('' when they do): the first sub-module
    that is not on `FUSED_LAYERS` (by name and exact class), has a setting they do not
    compute, computes dropout (training mode), has forward hooks or a `forward` of its own; a
    missing slot; a mix of int8 and float Linear layers. Called in every forward: one pass
    over `_modules`."""
    walk: list[tuple[str, nn.Module]] = [("", block)]
    int8 = 0
    for name, module in walk:  # breadth first; the loop reads what it appends
        cls, allowed = type(module), FUSED_LAYERS.get(name)
        if allowed is None or cls not in allowed:
            return _not_allowed(name, cls, allowed)
        int8 += cls is Int8Linear
        if (
            cls is nn.GELU
            or cls is Attention
            or (module.training and cls in _TRAINING_DIFFERS)
            or module._forward_hooks
            or module._forward_pre_hooks
            or "forward" in vars(module)
        ):
            unfused = _unfused_setting(name, module)
            if unfused:
                return unfused
        prefix = f"{name}." if name else ""
        walk.extend((prefix + child, sub) for child, sub in module._modules.items())
    if len(walk) != len(FUSED_LAYERS):  # every name was listed, so some are missing
        found = {name for name, _ in walk}
        return f"{next(name for name in FUSED_LAYERS if name not in found)} is missing"
    if 0 < int8 < len(_LINEAR_SLOTS):
        return "some of the block's Linear layers are int8 and others not"
    return ""


# -- the choice at build time, and the switch --------------------------------------------------


def layer_classes() -> tuple[type[Block], type[nn.Linear]]:
    """The classes a model builder uses for its pre-norm blocks and for the Linear layers of
    attention and MLP: `OneDNNBlock` and `OneDNNLinear` where this torch build can run them,
    `Block` and `nn.Linear` otherwise (`unsupported_reason` says why)."""
    if unsupported_reason():
        return Block, nn.Linear
    return OneDNNBlock, OneDNNLinear


def _fast_layers(model: nn.Module) -> tuple[list[OneDNNBlock], list[OneDNNLinear]]:
    blocks = [m for m in model.modules() if isinstance(m, OneDNNBlock)]
    linears = [m for m in model.modules() if isinstance(m, OneDNNLinear)]
    return blocks, linears


def fast_path_in_use(model: nn.Module) -> bool:
    """Whether any layer of `model` would take the oneDNN kernels (switched on, and a torch
    that has them)."""
    blocks, linears = _fast_layers(model)
    return any(layer.fast_path for layer in [*blocks, *linears]) and not unsupported_reason()


def log_fast_path(model: nn.Module, reason: str = "", level: int = logging.INFO) -> None:
    """One log line: the fast layers of `model` and their options (debug), or why the model
    runs the plain path (`reason`, else `unsupported_reason()`), at `level`."""
    reason = reason or unsupported_reason()
    if reason:
        logger.log(level, "plain path (no oneDNN fast path): %s", reason)
        return
    blocks, linears = _fast_layers(model)
    logger.debug(
        "oneDNN fast path in %d blocks and %d Linear layers: torch has the kernels it needs "
        "(GELU in the epilogue: %s; slices of %.3g MiB)",
        len(blocks),
        len(linears),
        blocks[0].gelu_in_epilogue if blocks else default_gelu_in_epilogue(),
        (blocks[0].slice_bytes if blocks else SLICE_BYTES) / 2**20,
    )


def enable_fast_path(
    model: nn.Module,
    enable: bool = True,
    *,
    gelu_in_epilogue: bool | None = None,
    slice_bytes: int = SLICE_BYTES,
    min_features: int = MIN_FEATURES,
) -> bool:
    """Switch the fast layers of `model` (its `OneDNNBlock` and `OneDNNLinear` modules, chosen
    when it was built) on, with these options, or off; returns whether the fast path is now
    on. Only flags and options change: the modules, their classes and parameters stay. Logs
    one line saying which path and why.

    Args:
        model: any module; its fast layers are switched.
        enable: False switches them off and frees the packed weight copies.
        gelu_in_epilogue: run fc1's GELU in oneDNN's epilogue; None asks the CPU
            (`default_gelu_in_epilogue`).
        slice_bytes: the fused path's slice budget for the MLP hidden activation.
        min_features: narrower Linear layers keep `F.linear`.
    """
    reason = unsupported_reason() if enable else "the fast path was switched off"
    if gelu_in_epilogue is None:
        gelu_in_epilogue = default_gelu_in_epilogue()
    blocks, linears = _fast_layers(model)
    for layer in [*blocks, *linears]:
        layer.fast_path = not reason
    if reason:
        for module in model.modules():
            _PACKED.pop(module, None)
    else:
        for block in blocks:
            block.gelu_in_epilogue, block.slice_bytes = gelu_in_epilogue, slice_bytes
        for linear in linears:
            linear.min_features = min_features
    log_fast_path(model, reason, logging.INFO if enable else logging.DEBUG)
    return not reason


def disable_fast_path(model: nn.Module) -> None:
    """Switch the fast layers of `model` off and free the packed weight copies."""
    enable_fast_path(model, False)
