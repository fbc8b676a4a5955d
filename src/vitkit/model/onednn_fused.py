"""The fused CPU inference path's shared machinery: what every family's fused block needs
(the ViT's `vit/onednn.py`, EVA's `eva/onednn.py`), so that each family's file holds only the
function its blocks compute.

- the kernels: oneDNN products on weights packed once into oneDNN's layout, with a GELU, SiLU,
  residual add or product in the epilogue (`linear`, `linear_gelu`, `linear_swish`,
  `linear_binary`), norms in the compute dtype (`fused_norm`), cache-sized slices of whole
  images (`fused_slices`);
- `FusedBlock`, the mixin of a fused block: its switch and options, `fast_path_blocker` (why a
  call takes the plain path: training, autograd, hooks, autocast other than bf16, dispatch
  modes, tensor subclasses, tracing, compiling, dtype, device, and the layers themselves), and
  `forward_fused`'s slices;
- the allow-list walk (`unfused_layer`): a block is fused only where each sub-module, by name
  and exact class, is one its family's list says the fused kernels compute;
- the switch over a whole model (`enable_fast_path`, `fast_path_in_use`, `FastPathSwitch`).

The private torch APIs called here are looked up once (`onednn_support.py`); where one is
missing the models are built with their plain layers.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .layers import DropPath
from .onednn_int8 import Int8Linear
from .onednn_linear import MIN_FEATURES, OneDNNLinear, onednn_inner_product
from .onednn_support import (
    default_gelu_in_epilogue,
    dispatch_mode,
    native_bf16,
    unsupported_reason,
)

logger = logging.getLogger(__name__)

# The fused path runs a batch in slices of whole images whose widest activation (the MLP's
# hidden layer) stays under this many bytes, so each kernel's output is still in the last-level
# cache when the next kernel reads it: ~5% faster on ViT-B/16 at batch 32 (4 slices) and ViT-S/16
# (2 slices) on a 2-core, 32 MiB-L3 machine, with identical outputs (rows are independent); on a
# 16 MiB-L3 one, 24 MiB still beat 12 and 6 MiB and unsliced batches.
SLICE_BYTES = 24 * 2**20

# -- the kernels ---------------------------------------------------------------------------------

# oneDNN-packed copies of the fused path's Linear weights, per layer and compute dtype (and rows,
# for a product split in two): kept off the module (no state-dict entry; deepcopy and pickle
# never see them) and dropped with it.
Rows = tuple[int, int]
_PACKED: weakref.WeakKeyDictionary[
    nn.Linear, dict[torch.dtype | tuple[torch.dtype, Rows], tuple[Tensor, int, Tensor]]
] = weakref.WeakKeyDictionary()


def packed_weight(
    layer: nn.Linear, tokens: int, dtype: torch.dtype, rows: Rows | None = None
) -> Tensor:
    """`layer.weight` (its `rows` where given) in `dtype` (bf16 under autocast), reordered into
    oneDNN's blocked layout once rather than in every call (~10% of ViT-S inference); packed
    again when the weight changes (an in-place update, new data, another dtype). The entry
    holds a view of the weight it packed, so that memory cannot be reused by another weight
    while the entry lives."""
    weight = layer.weight if rows is None else layer.weight[rows[0] : rows[1]]
    if weight.is_inference():
        # Made under torch.inference_mode(): no version counter tells in-place updates (such as
        # load_state_dict's) apart, so a cached copy could go stale; pack in every call.
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), tokens)
    key = dtype if rows is None else (dtype, rows)
    cached = _PACKED.setdefault(layer, {}).get(key)
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
    _PACKED[layer][key] = (weight.detach(), weight._version, packed)
    return packed


def drop_packed(model: nn.Module) -> None:
    """Free the packed weight copies of `model`'s layers."""
    for module in model.modules():
        _PACKED.pop(module, None)


def fused_slices(batch: int, tokens: int, hidden: int, itemsize: int, budget: int) -> int:
    """How many slices of whole images the fused path cuts a batch into, so that each slice's
    MLP hidden activation stays under `budget` bytes."""
    hidden_bytes = batch * tokens * hidden * itemsize
    return max(1, min(batch, -(-hidden_bytes // budget)))


def weight_bias(
    x: Tensor, layer: nn.Linear, bias: Tensor | None = None, rows: Rows | None = None
) -> tuple[Tensor, Tensor | None]:
    """The packed weight and the bias (the layer's, or `bias` where given), of the output
    `rows` where given, in `x`'s dtype."""
    bias = layer.bias if bias is None else bias
    if bias is not None and rows is not None:
        bias = bias[rows[0] : rows[1]]
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return packed_weight(layer, x.shape[0] * x.shape[1], x.dtype, rows), bias


def linear(
    x: Tensor,
    layer: nn.Linear | Int8Linear,
    out_dtype: torch.dtype | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """x W^T + b with oneDNN's inner-product kernel (faster than MKL's addmm here); `bias`
    replaces the layer's (EVA's q / v biases); an int8 layer writes `out_dtype` (default x's)."""
    if isinstance(layer, Int8Linear):
        return layer.forward_fused(x, out_dtype=out_dtype)
    return onednn_inner_product(x, *weight_bias(x, layer, bias))


def linear_gelu(x: Tensor, layer: nn.Linear | Int8Linear, in_epilogue: bool) -> Tensor:
    """GELU(x W^T + b): oneDNN's product, the GELU in its epilogue or in place after it."""
    if isinstance(layer, Int8Linear):
        return layer.forward_fused(x, "gelu")
    if not in_epilogue:
        return torch.ops.aten.gelu_(linear(x, layer))
    weight, bias = weight_bias(x, layer)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")


def linear_swish(x: Tensor, layer: nn.Linear, rows: Rows | None = None) -> Tensor:
    """SiLU(x W^T + b) (swish; of the output `rows` where given), the SiLU in oneDNN's
    epilogue."""
    weight, bias = weight_bias(x, layer, rows=rows)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "swish", [], "")


def linear_binary(
    x: Tensor, layer: nn.Linear | Int8Linear, other: Tensor, op: str, rows: Rows | None = None
) -> Tensor:
    """other `op` (x W^T + b) (of the output `rows` where given) in one oneDNN kernel, `op`
    'add' (a residual) or 'mul' (a gate) in the epilogue."""
    if isinstance(layer, Int8Linear) and op == "add" and rows is None:
        return layer.forward_fused(x, residual=other, out_dtype=other.dtype)
    weight, bias = weight_bias(x, layer, rows=rows)
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, bias, op)


def linear_add(x: Tensor, layer: nn.Linear | Int8Linear, residual: Tensor) -> Tensor:
    """residual + (x W^T + b) in one oneDNN kernel (the residual add runs in the epilogue)."""
    return linear_binary(x, layer, residual, "add")


def fused_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype the fused kernels would compute in: the input's, or bf16 under bf16 autocast
    over float32 weights; None under any other autocast."""
    if not torch.is_autocast_enabled("cpu"):
        return x.dtype
    if torch.get_autocast_dtype("cpu") == torch.bfloat16 and weight.dtype == torch.float32:
        return torch.bfloat16
    return None


def fused_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """`norm(x)` in x's dtype where the norm's weights are float32 (bf16 autocast): LayerNorm
    takes mixed dtypes (computing in float32); other norms run on float32 and are cast back."""
    weight = getattr(norm, "weight", None)
    if weight is None or weight.dtype == x.dtype or isinstance(norm, nn.LayerNorm):
        return norm(x)
    return norm(x.float()).to(x.dtype)


def _global_forward_hooks() -> bool:
    """Whether a global forward (pre-)hook would run (those of sub-modules: `unfused_layer`)."""
    return bool(
        nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    )


# -- the fused block ----------------------------------------------------------------------------


class FusedBlock:
    """The mixin of a block with a fused inference path (`class OneDNNBlock(FusedBlock,
    Block)`): the `fast_path` switch and options, `fast_path_blocker`, and `forward_fused`
    in cache-sized slices. The block defines `unfused_layer()` (its allow-list),
    `fused_weight()` (the float weight whose dtype the kernels compute in), `fused_hidden()`
    (its widest activation per token) and `_fused_slice(x, *args)` (the fused function)."""

    def _init_fast_path(self, gelu_in_epilogue: bool | None, slice_bytes: int) -> None:
        self.fast_path = True  # `enable_fast_path` switches it
        if gelu_in_epilogue is None:
            gelu_in_epilogue = default_gelu_in_epilogue()
        self.gelu_in_epilogue = gelu_in_epilogue
        self.slice_bytes = slice_bytes

    def train(self, mode: bool = True) -> Any:
        """Entering training drops the packed weights: an optimiser may update them in ways
        no version counter records (torch's fused AdamW does not bump it), so they are
        packed afresh at the next inference."""
        if mode:
            drop_packed(self)  # type: ignore[arg-type]
        return super().train(mode)  # type: ignore[misc]

    def unfused_layer(self) -> str:
        raise NotImplementedError

    def fused_weight(self) -> Tensor:
        raise NotImplementedError

    def fused_hidden(self) -> int:
        raise NotImplementedError

    def _fused_slice(self, x: Tensor, *args: Any) -> Tensor:
        raise NotImplementedError

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
        unfused = self.unfused_layer()
        if unfused:
            return unfused
        if x.device.type != "cpu":
            return f"the fused kernels are oneDNN's (CPU); the input is on {x.device.type}"
        weight = self.fused_weight()
        dtype = fused_dtype(x, weight)
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

    def run_fused(self, x: Tensor, *args: Any) -> Tensor:
        """`forward_fused(x, *args)`, in bf16 kernels under bf16 autocast (float32 weights)."""
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return self.forward_fused(x.to(torch.bfloat16), *args).to(x.dtype)
        return self.forward_fused(x, *args)

    def forward_fused(self, x: Tensor, *args: Any) -> Tensor:
        """Inference-only `forward` with fused oneDNN kernels; dropout and drop-path are the
        identity in eval mode, so the function is the same. Call through `forward`, which
        checks that it applies. Large batches run in cache-sized slices (`fused_slices`)."""
        batch, tokens, _ = x.shape
        hidden = self.fused_hidden()
        slices = fused_slices(batch, tokens, hidden, x.element_size(), self.slice_bytes)
        if slices == 1:
            return self._fused_slice(x, *args)
        return torch.cat([self._fused_slice(part, *args) for part in x.tensor_split(slices)])


# -- what the fused kernels implement: the allow-list walk ----------------------------------------

# Linear layers whose product `linear` computes (oneDNN's float kernel, or the int8 one).
LINEARS: tuple[type[nn.Module], ...] = (nn.Linear, OneDNNLinear, Int8Linear)
NORMS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)  # run as modules (`fused_norm`)
EVAL_IDENTITY: tuple[type[nn.Module], ...] = (nn.Identity, nn.Dropout, DropPath)
# The allowed layers that compute something else in training mode (dropout), besides the
# attention (a list's "attn" classes): the fused path leaves a block where one of them is
# (e.g. `block.attn.train()` in an eval model).
_TRAINING_DIFFERS: tuple[type[nn.Module], ...] = (nn.Dropout, DropPath)


def _unfused_setting(name: str, module: nn.Module, attentions: tuple[type, ...]) -> str:
    """What an allowed layer is set to that the fused kernels do not compute ('' if nothing)."""
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"{name} is GELU(approximate={module.approximate!r}); the fused one is exact"
    if type(module) in attentions and not module.fused_attn:
        return f"{name}.fused_attn is False (explicit attention requested)"
    name = name or "the block"
    if "forward" in vars(module):
        return f"{name} has a forward of its own (set on the instance)"
    if module.training and isinstance(module, (*_TRAINING_DIFFERS, *attentions)):
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


def unfused_layer(block: nn.Module, fused_layers: Mapping[str, tuple[type, ...]]) -> str:
    """Why the fused kernels do not compute `block` ('' when they do), against the allow-list
    `fused_layers` (sub-module name -> exact classes; its "attn" classes have `fused_attn`):
    the first sub-module that is not on it (by name and exact class), has a setting they do
    not compute, computes dropout (training mode), has forward hooks or a `forward` of its
    own; a missing slot; a mix of int8 and float Linear layers. Called in every forward: one
    pass over `_modules`."""
    attentions = fused_layers.get("attn", ())
    walk: list[tuple[str, nn.Module]] = [("", block)]
    int8 = 0
    for name, module in walk:  # breadth first; the loop reads what it appends
        cls, allowed = type(module), fused_layers.get(name)
        if allowed is None or cls not in allowed:
            return _not_allowed(name, cls, allowed)
        int8 += cls is Int8Linear
        if (
            cls is nn.GELU
            or cls in attentions
            or (module.training and cls in _TRAINING_DIFFERS)
            or module._forward_hooks
            or module._forward_pre_hooks
            or "forward" in vars(module)
        ):
            unfused = _unfused_setting(name, module, attentions)
            if unfused:
                return unfused
        prefix = f"{name}." if name else ""
        walk.extend((prefix + child, sub) for child, sub in module._modules.items())
    if len(walk) != len(fused_layers):  # every name was listed, so some are missing
        found = {name for name, _ in walk}
        return f"{next(name for name in fused_layers if name not in found)} is missing"
    if int8 and int8 < sum(Int8Linear in allowed for allowed in fused_layers.values()):
        return "some of the block's Linear layers are int8 and others not"
    return ""


# -- the switch over a model ----------------------------------------------------------------------


def _fast_layers(model: nn.Module) -> tuple[list[FusedBlock], list[OneDNNLinear]]:
    blocks = [m for m in model.modules() if isinstance(m, FusedBlock)]
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
    """Switch the fast layers of `model` (its `FusedBlock` and `OneDNNLinear` modules, chosen
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
        drop_packed(model)
    else:
        for block in blocks:
            block.gelu_in_epilogue, block.slice_bytes = gelu_in_epilogue, slice_bytes
        for linear_layer in linears:
            linear_layer.min_features = min_features
    log_fast_path(model, reason, logging.INFO if enable else logging.DEBUG)
    return not reason


def disable_fast_path(model: nn.Module) -> None:
    """Switch the fast layers of `model` off and free the packed weight copies."""
    enable_fast_path(model, False)


class FastPathSwitch:
    """The model methods of the CPU fast path, for a family whose builder chose fused blocks."""

    def set_fast_path(self, enable: bool = True) -> bool:
        """Switch the CPU fast path on (the default) or off; returns whether it is on: a flag on
        the fused blocks the model was built with, where torch has the kernels they call (see
        `fast_path_blocker` for when a block runs them); off also frees the packed weights."""
        return enable_fast_path(self, enable)  # type: ignore[arg-type]

    def fast_path_in_use(self) -> bool:
        """Whether any layer would take the CPU fast path's kernels (`set_fast_path`)."""
        return fast_path_in_use(self)  # type: ignore[arg-type]
