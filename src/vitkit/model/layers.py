"""The building blocks of a Vision Transformer.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale" (ICLR 2021), Section 3.1 and Appendix B.1. LayerScale is from Touvron et al., "Going
deeper with Image Transformers" (CaiT, 2021); stochastic depth from Huang et al. (2016).
The variants later families use are options of the same layers, each named where it is built:
q/k norm (ViT-22B), SwiGLU (Shazeer 2020), RMSNorm (Zhang & Sennrich 2019), residual post-norm
(Swin v2) and attention pooling with a learned query (SigLIP's MAP head, Lee et al. 2019).

Plain PyTorch only. The CPU fast path (`VisionTransformer.set_fast_path`) swaps subclasses of
`Block` and `nn.Linear` in place of these modules and computes the same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import (
    ACT_LAYERS,
    MLP_LAYERS,
    NORM_LAYERS,
    PATCH_EMBED_KINDS,
    check_choice,
    patch_grid,
    to_2tuple,
)


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's approximation of GELU."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(kind: str) -> nn.Module:
    """The activation module of `ViTConfig.act_layer`."""
    check_choice("act_layer", kind, ACT_LAYERS)
    if kind == "gelu":
        return nn.GELU()
    if kind == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if kind == "quick_gelu":
        return QuickGELU()
    return nn.SiLU()


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """The norm module of `ViTConfig.norm_layer`: LayerNorm, or RMSNorm (scale, no bias)."""
    check_choice("norm_layer", kind, NORM_LAYERS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    return nn.LayerNorm(dim, eps=eps)


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
        norm_layer: str = "layernorm",
        dynamic_img_size: bool = False,
        dynamic_img_pad: bool = False,
        conv_stem: tuple[int, ...] = (),
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_choice("patch_embed", kind, PATCH_EMBED_KINDS)
        self.img_size = to_2tuple(img_size, "img_size")
        self.patch_size = to_2tuple(patch_size, "patch_size")
        self.dynamic_img_pad = dynamic_img_pad
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
                proj_chans,
                embed_dim,
                kernel_size=self.patch_size,
                stride=self.patch_size,
                bias=bias,
            )
        else:
            self.unfold = nn.Unfold(kernel_size=self.patch_size, stride=self.patch_size)
            patch_dim = proj_chans * self.patch_size[0] * self.patch_size[1]
            self.proj = nn.Linear(patch_dim, embed_dim, bias=bias)
        self.norm = make_norm(norm_layer, embed_dim, norm_eps) if norm else nn.Identity()

    def grid_for(self, height: int, width: int, what: str = "input") -> tuple[int, int]:
        """The patch grid (rows, columns) of a height x width image; a ValueError with the fix
        when the image (or the stem's feature map) does not split into whole patches. With
        `dynamic_img_pad`, a partial patch counts (the input is padded to it)."""
        if self.dynamic_img_pad and what == "input":
            return -(-height // self.patch_size[0]), -(-width // self.patch_size[1])
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
        if not torch.jit.is_scripting():  # Python checks: not compiled by TorchScript,
            if not isinstance(x, torch.fx.Proxy):  # nor traced by torch.fx
                self.check_input(x)
                x = x.to(self.proj.weight.dtype)  # e.g. float32 images into a bf16 model, as HF
        if self.dynamic_img_pad:  # pad right and bottom to whole patches, as timm
            pad_h = -x.shape[-2] % self.patch_size[0]
            pad_w = -x.shape[-1] % self.patch_size[1]
            x = F.pad(x, (0, pad_w, 0, pad_h))  # (B, C, H + pad_h, W + pad_w)
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
    `qk_norm` normalises each head's queries and keys (ViT-22B), `scale_norm` the merged heads
    before the output projection (BEiT-3); both use `norm_layer`.
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
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
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
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = make_norm(norm_layer, dim, norm_eps) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Packed projections (B, N, 3 * D) -> q, k, v, each (B, heads, N, head_dim)."""
        batch, tokens, _ = qkv.shape
        qkv = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, heads, N, head_dim)
        q, k, v = qkv.unbind(0)
        return q, k, v

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """(B, heads, N, head_dim) -> (B, N, D), contiguous for the output projection."""
        return x.transpose(1, 2).flatten(2)  # (B, N, D)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.split_heads(self.qkv(x))
        return self.q_norm(q), self.k_norm(k), v

    def _out(self, x: Tensor) -> Tensor:
        return self.proj_drop(self.proj(self.norm(self.merge_heads(x))))

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
    """Linear -> GELU -> Dropout -> Linear -> Dropout (paper Eq. 3); another activation and a
    norm on the hidden layer (BEiT-3) are options."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        drop: float = 0.0,
        act_layer: str = "gelu",
        bias: bool = True,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class SwiGLU(nn.Module):
    """act(x W_g) * (x W_x) -> Dropout -> Linear -> Dropout (Shazeer, "GLU Variants Improve
    Transformer", 2020): gate `fc1_g` and value `fc1_x`, each `hidden_dim` wide."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        drop: float = 0.0,
        act_layer: str = "silu",
        bias: bool = True,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc1_x = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.act(self.fc1_g(x)) * self.fc1_x(x)  # (B, N, hidden)
        return self.drop2(self.fc2(self.norm(self.drop1(hidden))))


class SwiGLUPacked(nn.Module):
    """`SwiGLU` with gate and value packed in one `fc1` of width `hidden_dim`, gate first
    (timm's `GluMlp(gate_last=False)`, DINOv2-g); `fc2` takes `hidden_dim // 2`."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        drop: float = 0.0,
        act_layer: str = "silu",
        bias: bool = True,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim // 2, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # each (B, N, hidden / 2)
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


MLP_CLASSES = dict(zip(MLP_LAYERS, (Mlp, SwiGLU, SwiGLUPacked)))


def mlp_hidden_width(mlp_layer: str, dim: int, mlp_ratio: float) -> int:
    """The width of the hidden layer fed to the MLP's output (`fc2.in_features`)."""
    hidden = int(dim * mlp_ratio)
    return hidden // 2 if mlp_layer == "swiglu_packed" else hidden


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


class Block(nn.Module):
    """Pre-norm encoder block: x + MSA(LN(x)), then x + MLP(LN(x)) (paper Eqs. 2-3).

    Args:
        dim: token width.
        num_heads, qkv_bias, qk_scale, qk_norm, scale_attn_norm: the `Attention`'s options.
        mlp_ratio, mlp_layer, act_layer, scale_mlp_norm: the MLP's width, kind
            ('mlp', 'swiglu', 'swiglu_packed'), activation and hidden-layer norm.
        proj_bias: biases of the attention output and MLP layers.
        proj_drop, attn_drop, drop_path: dropout rates and stochastic depth.
        init_values: LayerScale init; None disables it.
        norm_layer, norm_eps: 'layernorm' or 'rmsnorm', and its epsilon, for every norm.
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
        norm_layer: str = "layernorm",
        act_layer: str = "gelu",
        mlp_layer: str = "mlp",
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        check_choice("mlp_layer", mlp_layer, MLP_LAYERS)
        self.norm1 = make_norm(norm_layer, dim, norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            qk_norm=qk_norm,
            scale_norm=scale_attn_norm,
            proj_bias=proj_bias,
            norm_layer=norm_layer,
            norm_eps=norm_eps,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = make_norm(norm_layer, dim, norm_eps)
        hidden = int(dim * mlp_ratio)
        mlp_norm = None
        if scale_mlp_norm:
            mlp_norm = make_norm(norm_layer, mlp_hidden_width(mlp_layer, dim, mlp_ratio), norm_eps)
        self.mlp = MLP_CLASSES[mlp_layer](
            dim, hidden, drop=proj_drop, act_layer=act_layer, bias=proj_bias, norm=mlp_norm
        )
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights (B, heads, N, N)."""
        attn_out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, weights


class ResPostBlock(Block):
    """Residual post-norm block: x + norm(MSA(x)), then x + norm(MLP(x)) (Liu et al., "Swin
    Transformer V2", 2022; timm's `ResPostBlock`). Same layers and keys as `Block`; no
    LayerScale (timm sets the norms' scale to `init_values` instead, at initialisation only)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x)))
        x = x + self.drop_path2(self.norm2(self.mlp(x)))
        return x

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        attn_out, weights = self.attn.forward_with_weights(x)
        x = x + self.drop_path1(self.norm1(attn_out))
        x = x + self.drop_path2(self.norm2(self.mlp(x)))
        return x, weights


class AttentionPool(nn.Module):
    """Multihead attention pooling: one learned query attends over the tokens, then a residual
    MLP (Lee et al., "Set Transformer", 2019; SigLIP's MAP head, timm's
    `AttentionPoolLatent`). Tokens (B, N, D) -> (B, D)."""

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        act_layer: str = "gelu",
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = make_norm(norm_layer, dim, norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        q = self.q(self.latent).reshape(1, 1, self.num_heads, self.head_dim)  # (1, 1, h, hd)
        q = q.transpose(1, 2).expand(batch, -1, -1, -1)  # (B, heads, 1, head_dim)
        kv = self.kv(x).reshape(batch, tokens, 2, self.num_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, heads, 1, head_dim)
        x = self.proj(x.transpose(1, 2).reshape(batch, dim))  # (B, D)
        return x + self.mlp(self.norm(x))
