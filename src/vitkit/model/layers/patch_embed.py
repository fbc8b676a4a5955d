"""Patch embedding: an image cut into patches, each projected to the model width.

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), Eq. 1 and the hybrid of
Section 3.1 (patches cut from a CNN's feature map); the convolutional stem is Xiao et al.,
"Early Convolutions Help Transformers See Better" (NeurIPS 2021).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...options import check_choice
from .mbconv import MbConvStages
from .norm import make_norm
from .resnetv2 import build_hybrid_backbone

PATCH_EMBED_KINDS = ("conv", "unfold")

# -- geometry: the one computation of the patch grid, used by the model, the weight converters
# and the position-embedding resampler --------------------------------------------------------


def to_2tuple(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as an (h, w) tuple of positive ints."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{name} must be a positive int or an (h, w) pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def stem_output_size(size: int, layers: int) -> int:
    """A side of the feature map after `layers` 3x3 stride-2 convolutions padded by 1."""
    for _ in range(layers):
        size = (size + 1) // 2
    return size


def patch_grid(
    height: int,
    width: int,
    patch_size: tuple[int, int],
    stem_layers: int = 0,
    what: str = "input",
    floor: bool = False,
) -> tuple[int, int]:
    """The patch grid (rows, columns) of a height x width image cut into `patch_size` patches,
    after `stem_layers` stride-2 stem convolutions; a ValueError with the fix when the image
    (or the stem's feature map) does not split into whole patches, unless `floor` (the last
    partial patch dropped)."""
    grid = []
    for side, size, patch in zip(("height", "width"), (height, width), patch_size):
        feature = stem_output_size(size, stem_layers)
        if feature % patch and not floor:
            if stem_layers:
                raise ValueError(
                    f"{what} {side} {size} gives a {feature}-pixel conv-stem feature map, "
                    f"not divisible by patch_size {side} {patch}; choose a size whose "
                    f"feature map is a multiple of {patch}"
                )
            if what == "input":
                raise ValueError(
                    f"input {side} {size} is not divisible by patch size {patch}; "
                    f"resize to a multiple of {patch}"
                )
            raise ValueError(
                f"{what} {side} {size} is not divisible by patch_size {side} {patch}; "
                f"use an {what} that is a multiple of {patch}"
            )
        grid.append(feature // patch)
    return grid[0], grid[1]


def patchify(images: Tensor, patch_size: tuple[int, int]) -> Tensor:
    """(B, C, H, W) -> (B, N, ph * pw * C), patches in row-major grid order."""
    b, c, h, w = images.shape
    ph, pw = patch_size
    x = images.reshape(b, c, h // ph, ph, w // pw, pw)  # (B, C, gh, ph, gw, pw)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, ph, pw, C)
    return x.reshape(b, (h // ph) * (w // pw), ph * pw * c)  # (B, N, ph*pw*C)


def unpatchify(patches: Tensor, patch_size: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """(B, N, ph * pw * C) -> (B, C, H, W), the inverse of `patchify`."""
    b, _, dim = patches.shape
    ph, pw = patch_size
    gh, gw = grid
    c = dim // (ph * pw)
    x = patches.reshape(b, gh, gw, ph, pw, c)  # (B, gh, gw, ph, pw, C)
    x = x.permute(0, 5, 1, 3, 2, 4)  # (B, C, gh, ph, gw, pw)
    return x.reshape(b, c, gh * ph, gw * pw)  # (B, C, H, W)


def conv_to_unfold_weight(weight: Tensor) -> Tensor:
    """Conv2d patch weight (D, C, ph, pw) -> Linear weight (D, C*ph*pw).

    nn.Unfold flattens each patch channel-major, then row, then column: the same order as a
    reshape of the convolution kernel, so the two embeddings compute the same function.
    """
    return weight.reshape(weight.shape[0], -1)  # (D, C*ph*pw)


def unfold_to_conv_weight(weight: Tensor, in_chans: int, patch_size: tuple[int, int]) -> Tensor:
    """Linear patch weight (D, C*ph*pw) -> Conv2d weight (D, C, ph, pw)."""
    return weight.reshape(weight.shape[0], in_chans, *patch_size)  # (D, C, ph, pw)


def adapt_input_conv(in_chans: int, conv_weight: Tensor, base_chans: int = 3) -> Tensor:
    """The weight (O, I, kh, kw) of a model's first convolution, pretrained on `base_chans`
    channels, for `in_chans` channels, as timm's `adapt_input_conv` (`_manipulate.py`): one
    channel sums the kernels (a grey image through it equals the image repeated to every
    channel through the original); other counts repeat them and scale by
    base_chans / in_chans. A space-to-depth stem (I a multiple of `base_chans`) sums within
    each spatial group."""
    if in_chans < 1 or base_chans < 1:
        raise ValueError("input and base channel counts must be positive")
    if conv_weight.ndim != 4:
        raise NotImplementedError(
            f"adapt_input_conv takes a Conv2d weight (O, I, kh, kw), got {conv_weight.ndim} dims"
        )
    out, inp, kh, kw = conv_weight.shape
    if in_chans == base_chans:
        return conv_weight
    dtype, weight = conv_weight.dtype, conv_weight.float()  # half weights sum in fp32
    if in_chans == 1:
        if inp > base_chans:  # (O, groups, base, kh, kw): one sum per spatial group
            if inp % base_chans:
                raise NotImplementedError(f"{inp} input channels are no groups of {base_chans}")
            weight = weight.reshape(out, inp // base_chans, base_chans, kh, kw).sum(dim=2)
        else:
            weight = weight.sum(dim=1, keepdim=True)  # (O, 1, kh, kw)
    elif inp != base_chans:
        raise NotImplementedError(
            f"a weight of {inp} input channels pretrained on {base_chans} cannot be adapted"
        )
    else:  # (O, in_chans, kh, kw): the kernels repeated, the sum kept
        repeat = math.ceil(in_chans / base_chans)
        weight = weight.repeat(1, repeat, 1, 1)[:, :in_chans] * (base_chans / float(in_chans))
    return weight.to(dtype)


class ConvStem(nn.Sequential):
    """3x3 convolution + BatchNorm + ReLU per entry of `channels`: the CNN of the paper's
    hybrid (Section 3.1), as in Xiao et al., "Early Convolutions Help Transformers See Better"
    (2021). Each layer of stride 2 (all, unless `strides` says) halves the image (rounding up);
    a stride-1 layer keeps its size."""

    def __init__(
        self, in_chans: int, channels: tuple[int, ...], strides: tuple[int, ...] = ()
    ) -> None:
        layers: list[nn.Module] = []
        for out, stride in zip(channels, strides or (2,) * len(channels)):
            layers += [
                nn.Conv2d(in_chans, out, kernel_size=3, stride=stride, padding=1, bias=False),
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
    and the patches are cut from its feature map; `hybrid='resnetv2'` makes that backbone
    timm's ResNetV2 of `hybrid_layers` blocks per stage (resnetv2.py; its stem alone when
    empty), as timm's `HybridEmbed`; `hybrid='mbconv'` ViTamin's stem (mbconv.py), which ends
    in its own convolution to `embed_dim`: `proj` is then the identity (timm's
    `HybridEmbed(proj=False)`) and the patches are single pixels. `floor_grid` cuts
    floor(size / patch) patches per side and lets the convolution drop the remaining pixels
    (timm's behaviour at a fixed size).
    """

    __jit_unused_properties__ = ["weight_dtype"]  # read in Python only, never compiled

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
        conv_stem_strides: tuple[int, ...] = (),
        hybrid: str = "none",
        hybrid_layers: tuple[int, ...] = (),
        hybrid_widths: tuple[int, ...] = (),
        floor_grid: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_choice("patch_embed", kind, PATCH_EMBED_KINDS)
        self.img_size = to_2tuple(img_size, "img_size")
        self.patch_size = to_2tuple(patch_size, "patch_size")
        self.dynamic_img_pad = dynamic_img_pad
        self.floor_grid = floor_grid
        self.backbone: nn.Module | None = None
        strides = tuple(conv_stem_strides) or (2,) * len(conv_stem)
        self.stem_layers = sum(stride == 2 for stride in strides)  # stride-2 layers
        if conv_stem:
            self.backbone = ConvStem(in_chans, tuple(conv_stem), strides)
        elif hybrid == "mbconv":
            layers, widths = tuple(hybrid_layers), tuple(hybrid_widths)
            self.backbone = MbConvStages(in_chans, layers, widths, embed_dim)
            self.stem_layers = self.backbone.num_strides
        elif hybrid != "none":
            self.backbone = build_hybrid_backbone(hybrid, in_chans, tuple(hybrid_layers))
            self.stem_layers = self.backbone.num_strides
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
        self.proj: nn.Module
        if hybrid == "mbconv":  # the backbone's last convolution projects already
            self.unfold = None
            self.proj = nn.Identity()
        elif kind == "conv":
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

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of the first weight the image meets."""
        return next(self.parameters()).dtype

    def grid_for(self, height: int, width: int, what: str = "input") -> tuple[int, int]:
        """The patch grid (rows, columns) of a height x width image; a ValueError with the fix
        when the image (or the stem's feature map) does not split into whole patches. With
        `dynamic_img_pad`, a partial patch counts (the input is padded to it)."""
        if self.dynamic_img_pad and what == "input":
            return -(-height // self.patch_size[0]), -(-width // self.patch_size[1])
        if self.floor_grid and what != "input":  # a fixed size only: `check_input` holds to it
            return height // self.patch_size[0], width // self.patch_size[1]
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
                x = x.to(self.weight_dtype)  # e.g. float32 images into a bf16 model, as HF
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
