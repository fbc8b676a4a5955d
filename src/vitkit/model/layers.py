"""The building blocks of a Vision Transformer.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale" (ICLR 2021), Section 3.1 and Appendix B.1. LayerScale is from Touvron et al., "Going
deeper with Image Transformers" (CaiT, 2021); stochastic depth from Huang et al. (2016).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .config import PATCH_EMBED_KINDS, check_choice, patch_grid, to_2tuple


def conv_to_unfold_weight(weight: Tensor) -> Tensor:
    """Conv2d patch weight (D, C, ph, pw) -> Linear weight (D, C*ph*pw).

    nn.Unfold flattens each patch channel-major, then row, then column: the same order as a
    reshape of the convolution kernel, so the two embeddings compute the same function.
    """
    return weight.reshape(weight.shape[0], -1)


def unfold_to_conv_weight(weight: Tensor, in_chans: int, patch_size: tuple[int, int]) -> Tensor:
    """Linear patch weight (D, C*ph*pw) -> Conv2d weight (D, C, ph, pw)."""
    return weight.reshape(weight.shape[0], in_chans, *patch_size)


class ConvStem(nn.Sequential):
    """3x3 stride-2 convolution + BatchNorm + ReLU per entry of `channels`: the CNN of the
    paper's hybrid (Section 3.1), as in Xiao et al., "Early Convolutions Help Transformers
    See Better" (2021). Each layer halves the image (rounding up)."""

    def __init__(self, in_chans: int, channels: tuple[int, ...]) -> None:
        layers: list[nn.Module] = []
        for out in channels:
            layers += [
                nn.Conv2d(in_chans, out, kernel_size=3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
            ]
            in_chans = out
        super().__init__(*layers)
        self.out_chans = in_chans

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """He (fan-out) normal convolutions, BatchNorm ones / zeros: the ResNet init."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


def _onednn_linear_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether `Linear` may call oneDNN: a float32 CPU input with nothing that needs to see
    (or cannot trace) the kernel: autocast, compiling or tracing, a dispatch mode such as
    FlopCounterMode, a tensor subclass, a torch.func transform."""
    return (
        not torch.compiler.is_compiling()  # first: the compiler must not trace the rest
        and not torch.jit.is_tracing()
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and not torch.is_autocast_enabled("cpu")
        and _get_current_dispatch_mode() is None
        and not torch.overrides.has_torch_function((x,))
        and not torch._C._are_functorch_transforms_active()
    )


def _onednn_inner_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """x W^T + b, forward and input gradient by oneDNN's inner product, weight gradient by
    torch.mm: the products MKL computes slowest on some CPUs go to oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _onednn_inner_product(x, weight, bias)

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
            grad_x = _onednn_inner_product(grad, weight.t().contiguous(), None)
        grad_weight = rows.t().mm(x.reshape(-1, x.shape[-1])) if need_weight else None
        grad_bias = rows.sum(0) if need_bias else None
        return grad_x, grad_weight, grad_bias


class Linear(nn.Linear):
    """`nn.Linear` whose product runs on oneDNN's inner-product kernel for float32 CPU inputs,
    in the forward and the input gradient (~1.3x MKL's GEMM on an AVX-512 AMD CPU, ~1.1-1.2x a
    whole ViT training step; ~1.1-1.2x the GEMM on an AVX2 one); anywhere else, with
    `fast_path = False`, and for layers narrower than `min_features` it is `F.linear`. Same
    parameters, state-dict keys and hooks as `nn.Linear`."""

    fast_path = True
    # Narrower products are too small to repay the custom kernel's per-call costs (measured:
    # a 128-wide encoder trained at 0.97x, a 192-wide one at 1.11x).
    min_features = 192

    def forward(self, x: Tensor) -> Tensor:
        narrow = min(self.in_features, self.out_features) < self.min_features
        if self.fast_path and not narrow and _onednn_linear_applies(x, self.weight):
            return _OneDNNLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class PatchEmbed(nn.Module):
    """Split an image into patches and project each to `embed_dim` (paper Eq. 1).

    `kind='conv'` is a Conv2d with kernel = stride = patch size; `kind='unfold'` cuts patches
    with nn.Unfold and projects them with a Linear layer. Both hold the projection under the
    name `proj`; `conv_to_unfold_weight` / `unfold_to_conv_weight` move weights between them.
    With `conv_stem` channels (the paper's hybrid), a `ConvStem` named `backbone` runs first
    and the patches are cut from its feature map.
    """

    def __init__(
        self,
        *,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        kind: str = "conv",
        norm: bool = False,
        norm_eps: float = 1e-6,
        dynamic_img_size: bool = False,
        conv_stem: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        check_choice("patch_embed", kind, PATCH_EMBED_KINDS)
        self.img_size = to_2tuple(img_size, "img_size")
        self.patch_size = to_2tuple(patch_size, "patch_size")
        self.backbone = ConvStem(in_chans, tuple(conv_stem)) if conv_stem else None
        self.stem_layers = len(conv_stem)
        # Image pixels per token along each side (timm's feature "reduction").
        self.reduction = (
            2**self.stem_layers * self.patch_size[0],
            2**self.stem_layers * self.patch_size[1],
        )
        self.grid_size = self.grid_for(*self.img_size, what="img_size")
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.kind = kind
        self.dynamic_img_size = dynamic_img_size
        proj_chans = self.backbone.out_chans if self.backbone is not None else in_chans
        if kind == "conv":
            self.unfold = None
            self.proj = nn.Conv2d(
                proj_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size
            )
        else:
            self.unfold = nn.Unfold(kernel_size=self.patch_size, stride=self.patch_size)
            patch_dim = proj_chans * self.patch_size[0] * self.patch_size[1]
            self.proj = nn.Linear(patch_dim, embed_dim)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if norm else nn.Identity()

    def grid_for(self, height: int, width: int, what: str = "input") -> tuple[int, int]:
        """The patch grid (rows, columns) of a height x width image; a ValueError with the fix
        when the image (or the stem's feature map) does not split into whole patches."""
        return patch_grid(height, width, self.patch_size, self.stem_layers, what)

    def check_input(self, x: Tensor) -> None:
        """Fail early, with the fix, on input the embedding cannot take."""
        if not isinstance(x, Tensor):
            raise TypeError(
                f"expected a torch.Tensor of shape (B, C, H, W), got {type(x).__name__}"
            )
        if x.ndim != 4:
            hint = "add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else "reshape it"
            raise ValueError(
                f"expected a 4-D input (B, C, H, W), got {x.ndim}-D shape {tuple(x.shape)}; {hint}"
            )
        if not x.is_floating_point():
            raise TypeError(
                f"expected a floating-point input, got {x.dtype}; convert with x.float() / 255"
            )
        if x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected {self.in_chans} input channels, got {x.shape[1]} (input shape "
                f"{tuple(x.shape)}); convert the images or build the model with "
                f"in_chans={x.shape[1]}"
            )
        height, width = x.shape[-2:]
        if self.dynamic_img_size:
            self.grid_for(height, width)
        elif (height, width) != self.img_size:
            raise ValueError(
                f"input size {height}x{width} differs from the model's img_size "
                f"{self.img_size[0]}x{self.img_size[1]}; resize the input, or build the model "
                "with dynamic_img_size=True to accept other sizes"
            )

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Return patch tokens (B, N, D) and the patch grid (rows, columns)."""
        self.check_input(x)
        if self.backbone is not None:
            x = self.backbone(x)  # (B, C', H', W')
        grid = (x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1])
        if self.unfold is None:
            x = self.proj(x)  # (B, D, H/ph, W/pw)
            x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        else:
            x = self.unfold(x)  # (B, C*ph*pw, N)
            x = self.proj(x.transpose(1, 2))  # (B, N, D)
        return self.norm(x), grid


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (paper Eq. 2, Appendix A).

    The default path calls `F.scaled_dot_product_attention` (fused kernels); the explicit path
    computes softmax(q k^T * scale) v itself and is the one that can hand back the weights.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(
                f"embed_dim {dim} is not divisible by num_heads {num_heads}; choose num_heads "
                f"among the divisors of {dim} or an embed_dim that is a multiple of {num_heads}"
            )
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale if qk_scale is not None else self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Packed projections (B, N, 3 * D) -> q, k, v, each (B, heads, N, head_dim)."""
        batch, tokens, _ = qkv.shape
        qkv = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, heads, N, head_dim)
        return qkv.unbind(0)

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """(B, heads, N, head_dim) -> (B, N, D), contiguous for the output projection."""
        return x.transpose(1, 2).flatten(2)  # (B, N, D)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.split_heads(self.qkv(x))

    def _out(self, x: Tensor) -> Tensor:
        return self.proj_drop(self.proj(self.merge_heads(x)))

    def attention_weights(self, q: Tensor, k: Tensor) -> Tensor:
        """softmax(q k^T * scale), in fp32 even under autocast: (B, heads, N, N)."""
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        return scores.float().softmax(dim=-1).to(q.dtype)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._qkv(x)  # each (B, heads, N, head_dim)
        if self.fused_attn:
            dropout_p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        else:
            x = self.attn_drop(self.attention_weights(q, k)) @ v  # (B, heads, N, head_dim)
        return self._out(x)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the attention weights (B, heads, N, N)."""
        q, k, v = self._qkv(x)
        weights = self.attention_weights(q, k)
        x = self.attn_drop(weights) @ v  # (B, heads, N, head_dim)
        return self._out(x), weights


class Mlp(nn.Module):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (paper Eq. 3)."""

    def __init__(self, dim: int, hidden_dim: int, *, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch for a whole sample with probability `p`."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT), initialised to `init_values`."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), init_values))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


def _has_forward_hooks(module: nn.Module) -> bool:
    """Whether any forward (pre-)hook, global or on `module` or a sub-module, would run."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


# oneDNN-packed copies of the fused path's Linear weights, per layer: kept off the module (no
# state-dict entry; deepcopy and pickle never see them) and dropped with it.
_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple[Tensor, int, Tensor]] = (
    weakref.WeakKeyDictionary()
)


def _packed_weight(layer: nn.Linear, tokens: int) -> Tensor:
    """`layer.weight` reordered into oneDNN's blocked layout once rather than in every call
    (~10% of ViT-S inference); packed again when the weight changes (an in-place update, new
    data, another dtype). The entry holds a view of the weight it packed, so that memory
    cannot be reused by another weight while the entry lives."""
    weight = layer.weight
    cached = _PACKED.get(layer)
    if cached is not None:
        source, version, packed = cached
        if (
            source.data_ptr() == weight.data_ptr()
            and source.dtype == weight.dtype
            and source.shape == weight.shape
            and version == weight._version
        ):
            return packed
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), tokens)
    _PACKED[layer] = (weight.detach(), weight._version, packed)
    return packed


def drop_packed_weights(module: nn.Module) -> None:
    """Free the packed weight copies of every Linear layer in `module`."""
    for layer in module.modules():
        _PACKED.pop(layer, None)


# The fused path runs a batch in slices of whole images whose widest activation (the MLP's
# hidden layer) stays under this many bytes, so each kernel's output is still in the last-level
# cache when the next kernel reads it: ~5% faster on ViT-B/16 at batch 32 (4 slices) and ViT-S/16
# (2 slices) on a 2-core, 32 MiB-L3 machine, with identical outputs (rows are independent); on a
# 16 MiB-L3 one, 24 MiB still beat 12 and 6 MiB and unsliced batches.
FUSED_SLICE_BYTES = 24 * 2**20


def fused_slices(batch: int, tokens: int, hidden: int, itemsize: int) -> int:
    """How many slices of whole images the fused path cuts a batch into."""
    hidden_bytes = batch * tokens * hidden * itemsize
    return max(1, min(batch, -(-hidden_bytes // FUSED_SLICE_BYTES)))


# Whether the fused path runs fc1's GELU in oneDNN's GEMM epilogue or as an in-place torch GELU
# after the product. The epilogue's erf is slow without AVX-512: on an AVX2 CPU it held fc1 to
# ~106 GFLOP/s against ~130 for the product followed by `gelu_` (ViT-B/16 shapes, 2 threads).
GELU_IN_EPILOGUE = torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _linear_gelu(x: Tensor, layer: nn.Linear) -> Tensor:
    """GELU(x W^T + b): oneDNN's product, the GELU in its epilogue or in place after it."""
    if not GELU_IN_EPILOGUE:
        return torch.ops.aten.gelu_(_linear(x, layer))
    weight = _packed_weight(layer, x.shape[0] * x.shape[1])
    return torch.ops.mkldnn._linear_pointwise(x, weight, layer.bias, "gelu", [], "none")


def _linear_add(x: Tensor, layer: nn.Linear, residual: Tensor) -> Tensor:
    """residual + (x W^T + b) in one oneDNN kernel (the residual add runs in the epilogue)."""
    weight = _packed_weight(layer, x.shape[0] * x.shape[1])
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, layer.bias, "add")


def _linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """x W^T + b with oneDNN's inner-product kernel (faster than MKL's addmm here)."""
    return _onednn_inner_product(x, _packed_weight(layer, x.shape[0] * x.shape[1]), layer.bias)


class Block(nn.Module):
    """Pre-norm encoder block: x + MSA(LN(x)), then x + MLP(LN(x)) (paper Eqs. 2-3).

    In eval mode with grad disabled on CPU, `forward` takes a fused inference path (oneDNN
    GEMMs with the bias, GELU and residual add fused in, on weights packed once into oneDNN's
    layout, and SDPA attention) whenever `fast_path_blocker` finds nothing against it;
    `fast_path = False` switches it off.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.fast_path = True

    def fast_path_blocker(self, x: Tensor) -> str:
        """Why `forward(x)` takes the plain path rather than the fused one ('' if it does not).

        The fused path computes the same function without running the sub-modules, so it is
        left whenever something needs them to run: training, autograd, hooks (e.g.
        `vitkit.summary`), a dispatch mode (e.g. FlopCounterMode), tracing or compiling.
        """
        weight = self.attn.qkv.weight
        if not self.fast_path:
            return "the fast path is switched off (fast_path = False)"
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return "compiling or tracing (the compiler does its own fusion)"
        if self.training:
            return "the block is in training mode"
        if torch.is_grad_enabled():
            return "grad is enabled; run under torch.inference_mode() or torch.no_grad()"
        if not isinstance(self.ls1, nn.Identity) or not isinstance(self.ls2, nn.Identity):
            return "LayerScale is not fused"
        if not self.attn.fused_attn:
            return "attn.fused_attn is False (explicit attention requested)"
        if x.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            return f"the fused kernels are oneDNN's (CPU); the input is on {x.device.type}"
        if x.ndim != 3 or x.dtype != weight.dtype:
            return f"input {x.dtype} {x.ndim}-D does not match 3-D {weight.dtype} weights"
        if x.dtype not in (torch.float32, torch.bfloat16) or (
            x.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
        ):
            return f"oneDNN has no fast {x.dtype} kernel on this CPU"
        if torch.is_autocast_enabled("cpu"):
            return "autocast is enabled"
        if _get_current_dispatch_mode() is not None or torch.overrides.has_torch_function((x,)):
            return "a dispatch mode or tensor subclass is active"
        if _has_forward_hooks(self):
            return "forward hooks are registered on the block or its sub-layers"
        return ""

    def forward(self, x: Tensor) -> Tensor:
        if not self.fast_path_blocker(x):
            return self.forward_fused(x)
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def forward_fused(self, x: Tensor) -> Tensor:
        """Inference-only `forward` with fused oneDNN kernels; dropout and drop-path are the
        identity in eval mode, so the function is the same. Call through `forward`, which
        checks that it applies. Large batches run in cache-sized slices (`fused_slices`)."""
        batch, tokens, _ = x.shape
        slices = fused_slices(batch, tokens, self.mlp.fc1.out_features, x.element_size())
        if slices == 1:
            return self._fused_slice(x)
        return torch.cat([self._fused_slice(part) for part in x.tensor_split(slices)])

    def _fused_slice(self, x: Tensor) -> Tensor:
        attn = self.attn
        q, k, v = attn.split_heads(_linear(self.norm1(x), attn.qkv))  # (B, heads, N, head_dim)
        h = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)  # (B, heads, N, head_dim)
        x = _linear_add(attn.merge_heads(h), attn.proj, x)  # (B, N, D)
        h = _linear_gelu(self.norm2(x), self.mlp.fc1)  # (B, N, hidden)
        return _linear_add(h, self.mlp.fc2, x)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights (B, heads, N, N)."""
        attn_out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, weights
