"""The MLP of an encoder block and its activations.

The paper's MLP is two Linear layers with a GELU between (Dosovitskiy et al., "An Image is
Worth 16x16 Words", ICLR 2021, Eq. 3; GELU is Hendrycks & Gimpel, 2016). The gated variant is
SwiGLU (Shazeer, "GLU Variants Improve Transformer", 2020); QuickGELU is OpenAI CLIP's
approximation (Radford et al., 2021); a norm on the hidden layer is BEiT-3's (Wang et al., 2022).
GeGLU (the same paper's GELU gate) with a LayerNorm before it is ViTamin's (Chen et al., CVPR
2024; timm's `GeGluMlp`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...options import check_choice

ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLP_LAYERS = ("mlp", "swiglu", "swiglu_packed", "geglu")
# ViTamin's LayerNorm before the gate (timm's `GeGluMlp`: eps 1e-6, whatever the blocks' norm).
GEGLU_NORM_EPS = 1e-6


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


class Mlp(nn.Module):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (paper Eq. 3); another activation and a
    norm on the hidden layer (BEiT-3) are options. Every MLP kind builds its Linear layers as
    `linear_layer` (an `nn.Linear` subclass computing the same function, e.g. a faster kernel)."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        drop: float = 0.0,
        act_layer: str = "gelu",
        bias: bool = True,
        norm: nn.Module | None = None,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        self.fc1 = linear_layer(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = linear_layer(hidden_dim, dim, bias=bias)
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
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        self.fc1_g = linear_layer(dim, hidden_dim, bias=bias)
        self.fc1_x = linear_layer(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = linear_layer(hidden_dim, dim, bias=bias)
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
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        self.fc1 = linear_layer(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = linear_layer(hidden_dim // 2, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)  # each (B, N, hidden / 2)
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


class GeGLU(nn.Module):
    """LayerNorm -> act(x W_0) * (x W_1) -> Dropout -> Linear -> Dropout: ViTamin's MLP (timm's
    `GeGluMlp`, whose names `w0`, `w1`, `w2` it keeps), GELU-gated, normed at its input."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        drop: float = 0.0,
        act_layer: str = "gelu",
        bias: bool = True,
        norm: nn.Module | None = None,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        if norm is not None:
            raise ValueError(
                "mlp_layer='geglu' has its own norm before the gate; drop scale_mlp_norm"
            )
        self.norm = nn.LayerNorm(dim, eps=GEGLU_NORM_EPS)
        self.w0 = linear_layer(dim, hidden_dim, bias=bias)
        self.act = make_act(act_layer)
        self.w1 = linear_layer(dim, hidden_dim, bias=bias)
        self.drop1 = nn.Dropout(drop)
        self.w2 = linear_layer(hidden_dim, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        hidden = self.act(self.w0(x)) * self.w1(x)  # (B, N, hidden)
        return self.drop2(self.w2(self.drop1(hidden)))


MLP_CLASSES = dict(zip(MLP_LAYERS, (Mlp, SwiGLU, SwiGLUPacked, GeGLU)))


def mlp_hidden_width(mlp_layer: str, dim: int, mlp_ratio: float) -> int:
    """The width of the hidden layer fed to the MLP's output (`fc2.in_features`)."""
    hidden = int(dim * mlp_ratio)
    return hidden // 2 if mlp_layer == "swiglu_packed" else hidden
