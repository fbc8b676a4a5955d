"""Inference in lower precision: bfloat16 where the CPU computes it natively, int8 anywhere.

- `bf16`: the model's weights become bfloat16 (inputs are cast by the patch embedding, as
  Hugging Face's ViT does), and the CPU fast path (`vit/onednn.py`) runs its fused blocks on
  oneDNN's bf16 kernels with weights packed once. On a CPU without native bf16 (AVX-512 BF16
  or AMX), bf16 products are emulated and slower than float32, so `set_precision` keeps
  float32 there and logs why; on a GPU bf16 always applies. `torch.autocast('cpu',
  torch.bfloat16)` over a float32 model takes the same fused bf16 kernels.
- `int8`: dynamic quantisation of every Linear of the encoder blocks and the head, weights
  int8 per output channel, activations quantised per call: 4x smaller Linear weights, CPU
  only. `Int8Linear` (`onednn_int8.py`: oneDNN's int8 products; in the fast blocks with GELU
  and residual adds in their epilogues and bf16 attention where the CPU has native bf16) where
  torch has the operators; elsewhere `torch.ao.quantization.quantize_dynamic`'s Linear (the
  fast path's `OneDNNLinear` layers are in the mapping handed to it, which maps exact classes
  only, so nothing is switched).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from .onednn_int8 import Int8Linear, int8_unsupported_reason
from .onednn_linear import OneDNNLinear
from .onednn_support import native_bf16

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")

# oneDNN's int8 products (AMX / VNNI where the CPU has them) rather than torch's default 'x86'
# engine (FBGEMM for these layers): measured on an AMX Xeon, 4 threads, batch 32, one run:
# ViT-S/16 56.4 against 45.1 img/s, ViT-B/16 23.0 against 15.8; alike on an AVX2 CPU.
INT8_ENGINE = "onednn"


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def set_precision(model: nn.Module, precision: str) -> str:
    """Put `model` (in place, for inference) in `precision` ('fp32', 'bf16' or 'int8') and
    return the precision it now runs in: 'fp32' where bf16 is asked for on a CPU without
    native bf16 (logged as a warning, with the reason). The model is put in eval mode.

    int8 models are CPU-only and cannot be trained or saved as vitkit checkpoints; keep the
    float32 weights and quantise after loading.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    model.eval()
    if precision != "int8" and is_int8(model):
        raise ValueError(
            f"the model is int8-quantised and cannot run in {precision}; load the float "
            "checkpoint again for fp32 or bf16"
        )
    device = model_device(model)
    if precision == "fp32":
        model.float()
        return "fp32"
    if precision == "bf16":
        if device.type == "cpu" and not native_bf16():
            log.warning(
                "this CPU has no native bf16 (AVX-512 BF16 or AMX), where bf16 runs slower "
                "than fp32; running fp32"
            )
            return "fp32"
        model.to(torch.bfloat16)
        return "bf16"
    if device.type != "cpu":
        raise ValueError(
            f"int8 (dynamic quantisation) runs on CPU only; the model is on {device}: move it "
            "with model.cpu() or use --device cpu"
        )
    quantize_int8(model)
    return "int8"


def is_int8(model: nn.Module) -> bool:
    """Whether `model` holds int8 Linear layers (`quantize_int8`'s, either kind)."""
    return any(
        isinstance(m, Int8Linear) or type(m).__module__.startswith("torch.ao.nn.quantized")
        for m in model.modules()
    )


# The parts of a model whose Linear layers are quantised (a bare Linear head too): encoder
# blocks (a Swin's stages, patch merging included), attention pool and head; not the patch
# embedding, whose input is pixels.
INT8_PARTS = ("blocks", "layers", "attn_pool", "head")


def quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantisation of every `nn.Linear` in `model`'s `INT8_PARTS`, in place;
    returns `model`. `Int8Linear` (oneDNN's int8 kernels, fused into the fast blocks) where
    torch has them, else `torch.ao.quantization.quantize_dynamic`'s Linear."""
    model.float()
    if not int8_unsupported_reason():
        for part in INT8_PARTS:
            if getattr(model, part, None) is not None:
                _swap_linears(model, part)
        return model
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    spec = {name: qconfig for name in INT8_PARTS if hasattr(model, name)}
    mapping = (
        torch.ao.quantization.quantization_mappings.get_default_dynamic_quant_module_mappings()
    )
    mapping = {**mapping, OneDNNLinear: _OneDNNLinearToInt8}
    with warnings.catch_warnings(), _quantized_engine(INT8_ENGINE):
        warnings.simplefilter("ignore")  # the torchao migration notice of torch >= 2.10
        torch.ao.quantization.quantize_dynamic(
            model, spec, mapping=mapping, dtype=torch.qint8, inplace=True
        )
    return model


def _swap_linears(parent: nn.Module, name: str) -> None:
    """Replace `parent.<name>` if it is a Linear (exactly `nn.Linear` or the fast path's
    `OneDNNLinear`: a subclass computing something else is left), else every such Linear below
    it, with `Int8Linear`."""
    child = getattr(parent, name)
    if type(child) in (nn.Linear, OneDNNLinear):
        setattr(parent, name, Int8Linear.from_float(child))
        return
    for grandchild in list(child._modules):
        if child._modules[grandchild] is not None:
            _swap_linears(child, grandchild)


class _OneDNNLinearToInt8:
    """quantize_dynamic's entry for `OneDNNLinear`: the int8 Linear of the same weights.
    (`nnqd.Linear.from_float` accepts exact `nn.Linear`s only; `OneDNNLinear` computes the same
    function with the same parameters, so a plain view of them is what it quantises.)"""

    @staticmethod
    def from_float(module: OneDNNLinear, use_precomputed_fake_quant: bool = False) -> nn.Module:
        plain = nn.Linear(module.in_features, module.out_features, bias=False, device="meta")
        plain.weight, plain.bias = module.weight, module.bias
        plain.qconfig = module.qconfig
        dynamic = torch.ao.nn.quantized.dynamic.Linear
        return dynamic.from_float(plain, use_precomputed_fake_quant=use_precomputed_fake_quant)


@contextlib.contextmanager
def _quantized_engine(engine: str) -> Iterator[None]:
    """Pack the int8 weights for `engine` where torch has it (the packed weights keep their
    kernels; the global setting is restored)."""
    previous = torch.backends.quantized.engine
    if engine in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous
