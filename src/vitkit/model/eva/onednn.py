"""EVA's CPU fast path: `OneDNNEvaBlock`, an `EvaBlock` whose `forward`, in eval mode with grad
off on CPU, runs fused oneDNN kernels, and is the plain block's otherwise.

A reader of the model can skip this module: block.py and attention.py are the paper, and this
file only makes the same function faster on CPUs, with the machinery the ViT's fused block
uses (`model/onednn_fused.py`): oneDNN products on weights packed once, the bias, GELU or
SiLU, the SwiGLU gate's product and the residual add in their epilogues, SDPA attention,
cache-sized slices of whole images; float32, or bf16 where the CPU has native bf16. The
rotary embedding is the plain attention's own (`EvaAttention.heads`: q / k norm, RoPE on the
patch tokens only, the prefix tokens as they are, grouped key / value heads), so both paths
rotate alike. The block is fused only where each sub-module is on the allow-list of its
layout (`fused_layers`); otherwise, and wherever something needs the layers to run
(training, autograd, hooks, tracing, ...: `FusedBlock.fast_path_blocker`), it takes the plain
path and says why.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.mlp import Mlp, SwiGLU, SwiGLUPacked
from ..onednn_fused import (
    EVAL_IDENTITY,
    NORMS,
    SLICE_BYTES,
    FusedBlock,
    fused_norm,
    linear,
    linear_add,
    linear_binary,
    linear_gelu,
    linear_swish,
)
from ..onednn_fused import unfused_layer as unfused_in
from ..onednn_support import default_gelu_in_epilogue, record_as_leaf, unsupported_reason
from .attention import EvaAttention
from .block import EvaBlock
from .config import EvaConfig


class OneDNNEvaBlock(FusedBlock, EvaBlock):
    """`EvaBlock` with the fused inference path (`forward_fused`) wherever
    `fast_path_blocker` finds nothing against it.

    Args:
        config, drop_path, index: `EvaBlock`'s.
        gelu_in_epilogue: run fc1's GELU in oneDNN's epilogue; None asks the CPU.
        slice_bytes: the budget of `fused_slices`.
    """

    def __init__(
        self,
        config: EvaConfig,
        *,
        drop_path: float = 0.0,
        index: int = 0,
        gelu_in_epilogue: bool | None = None,
        slice_bytes: int = SLICE_BYTES,
    ) -> None:
        super().__init__(config, drop_path=drop_path, index=index)
        self._init_fast_path(gelu_in_epilogue, slice_bytes)

    def unfused_layer(self) -> str:
        separate = self.attn.qkv is None
        return unfused_in(self, fused_layers(separate, type(self.mlp)))

    def fused_weight(self) -> Tensor:
        return self.attn.proj.weight

    def fused_hidden(self) -> int:
        mlp = self.mlp
        if type(mlp) is SwiGLU:  # gate and value side by side
            return 2 * mlp.fc1_g.out_features
        return mlp.fc1.out_features

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript compiles the plain block below
            if self.fast_path and isinstance(x, torch.fx.Proxy):
                leaf = record_as_leaf(self, x, rope)  # torch.fx: one call to this block
                if leaf is not None:
                    return leaf
            if not self.fast_path_blocker(x):
                return self.run_fused(x, rope)
        return EvaBlock.forward(self, x, rope)

    def _fused_slice(self, x: Tensor, rope: Tensor | None) -> Tensor:
        attn = self.attn
        source = x if self.post_norm else fused_norm(self.norm1, x)
        q, k, v = attn.heads(*self._project(source), rope)  # each (B, heads, N, hd)
        h = F.scaled_dot_product_attention(q, k, v)  # (B, heads, N, hd)
        h = fused_norm(attn.norm, h.transpose(1, 2).flatten(2))  # (B, N, D)
        x = self._add_branch(x, h, attn.proj, self.gamma_1, self.norm1)
        source = x if self.post_norm else fused_norm(self.norm2, x)
        return self._add_branch(x, self._mlp_hidden(source), self.mlp.fc2, self.gamma_2, self.norm2)

    def _project(self, x: Tensor) -> tuple[Tensor, ...]:
        """Tokens (B, N, D) -> q (B, N, D), k and v (B, N, kv_heads * hd) on oneDNN."""
        attn = self.attn
        if attn.qkv is not None:
            qkv = linear(x, attn.qkv, bias=attn.qkv_bias())  # (B, N, 3 * D)
            return qkv.chunk(3, dim=-1)
        return tuple(linear(x, layer) for layer in (attn.q_proj, attn.k_proj, attn.v_proj))

    def _mlp_hidden(self, x: Tensor) -> Tensor:
        """The MLP's hidden layer (B, N, hidden), activated, gated and normed: what fc2 reads."""
        mlp = self.mlp
        if type(mlp) is Mlp:
            in_epilogue = self.gelu_in_epilogue
            if in_epilogue is None:
                in_epilogue = default_gelu_in_epilogue()
            hidden = linear_gelu(x, mlp.fc1, in_epilogue)
        elif type(mlp) is SwiGLU:  # SiLU(x W_g) * (x W_x), each in an epilogue
            hidden = linear_binary(x, mlp.fc1_x, linear_swish(x, mlp.fc1_g), "mul")
        else:  # SwiGLUPacked: gate and value are halves of fc1, run as two products
            half = mlp.fc1.out_features // 2
            gate = linear_swish(x, mlp.fc1, rows=(0, half))  # (B, N, hidden)
            hidden = linear_binary(x, mlp.fc1, gate, "mul", rows=(half, 2 * half))
        return fused_norm(mlp.norm, hidden)

    def _add_branch(
        self, x: Tensor, h: Tensor, layer: nn.Linear, gamma: Tensor | None, post: nn.Module
    ) -> Tensor:
        """x plus the branch's output projection of h: as it is (the add in the product's
        epilogue), scaled by LayerScale's gamma, or normed by `post` (post-norm blocks)."""
        if self.post_norm:
            return x + fused_norm(post, linear(h, layer))
        if gamma is None:
            return linear_add(h, layer, x)
        return torch.addcmul(x, linear(h, layer), gamma.to(x.dtype))


# -- what the fused kernels implement: an allow-list per layout --------------------------------

# Float Linear layers only: EVA's q / v biases replace the qkv product's bias, which an int8
# layer would not take.
_LINEARS: tuple[type[nn.Module], ...] = (nn.Linear,)
# q / k norms run as modules inside `EvaAttention.heads` (no cast for bf16 over float32
# weights, which LayerNorm alone takes without a warning).
_QK_NORMS: tuple[type[nn.Module], ...] = (nn.Identity, nn.LayerNorm)
_HIDDEN_NORMS: tuple[type[nn.Module], ...] = (nn.Identity, *NORMS)  # scale_mlp / inner norm
_MLP_SLOTS: dict[type[nn.Module], tuple[str, ...]] = {
    Mlp: ("fc1",),
    SwiGLU: ("fc1_g", "fc1_x"),
    SwiGLUPacked: ("fc1",),
}
_ACTIVATIONS: dict[type[nn.Module], tuple[type[nn.Module], ...]] = {
    Mlp: (nn.GELU,),  # exact (checked by the walk)
    SwiGLU: (nn.SiLU,),
    SwiGLUPacked: (nn.SiLU,),
}


@functools.cache
def fused_layers(separate_qkv: bool, mlp_class: type[nn.Module]) -> dict[str, tuple[type, ...]]:
    """Every sub-module of a block the fused path runs, by name, and the exact classes it may
    be: norm1 -> attn.qkv (or q / k / v_proj) -> q / k norm, RoPE -> SDPA -> attn.norm ->
    attn.proj (+ LayerScale) + x -> norm2 -> the MLP (GELU, SwiGLU packed or not, a hidden
    norm) -> mlp.fc2 (+ LayerScale) + x. A layer not listed, a subclass, a missing slot or
    an MLP of another class sends the block down the plain path with the reason."""
    projections = ("q_proj", "k_proj", "v_proj") if separate_qkv else ("qkv",)
    first = _MLP_SLOTS.get(mlp_class, ())
    return {
        "": (OneDNNEvaBlock,),
        "norm1": NORMS,
        "attn": (EvaAttention,),
        **{f"attn.{name}": _LINEARS for name in projections},
        "attn.q_norm": _QK_NORMS,
        "attn.k_norm": _QK_NORMS,
        "attn.attn_drop": EVAL_IDENTITY,
        "attn.norm": _HIDDEN_NORMS,
        "attn.proj": _LINEARS,
        "attn.proj_drop": EVAL_IDENTITY,
        "drop_path1": EVAL_IDENTITY,
        "norm2": NORMS,
        "mlp": tuple(_MLP_SLOTS),
        **{f"mlp.{name}": _LINEARS for name in first},
        "mlp.act": _ACTIVATIONS.get(mlp_class, ()),
        "mlp.drop1": EVAL_IDENTITY,
        "mlp.norm": _HIDDEN_NORMS,
        "mlp.fc2": _LINEARS,
        "mlp.drop2": EVAL_IDENTITY,
        "drop_path2": EVAL_IDENTITY,
    }


def eva_block_class() -> type[EvaBlock]:
    """The block class the EVA builder uses: `OneDNNEvaBlock` where this torch build can run
    its kernels, `EvaBlock` otherwise (`unsupported_reason` says why)."""
    return EvaBlock if unsupported_reason() else OneDNNEvaBlock
