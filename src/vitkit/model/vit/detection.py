"""A plain ViT as a detection backbone: ViTDet's simple feature pyramid.

Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection" (ECCV 2022),
Section 3 and Figure 2 (c): the maps of every scale come from the ViT's last feature map alone,
by 2x deconvolutions up and a 2x max-pool down, each followed by a 1x1 and a 3x3 convolution
with a LayerNorm (detectron2's `SimpleFeaturePyramid`); one more level is the last one
subsampled (torchvision's `LastLevelMaxPool`). The output is an ordered dict of maps with
`out_channels` set, what torchvision's detectors (`FasterRCNN`, `RetinaNet`, `MaskRCNN`,
`FCOS`) take as a backbone.

    image (B, 3, H, W)
      -> ViT, block `block_index`   (B, D, H/16, W/16)   patch tokens as a map
      -> scale 4:   deconv 2x, LN, GELU, deconv 2x  (B, D/4, H/4, W/4)
         scale 2:   deconv 2x                       (B, D/2, H/8, W/8)
         scale 1:   identity                        (B, D, H/16, W/16)
         scale 0.5: max-pool 2x                     (B, D, H/32, W/32)
      -> each: 1x1 conv, LN, 3x3 conv, LN           (B, out_channels, ...)
      -> 'pool': the last level max-pooled 2x       (B, out_channels, H/64, W/64)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import torch.nn.functional as F
from torch import Tensor, nn

from ..intermediates import take_indices
from ..layers import LayerNorm2d
from ..stages import FlowSpec, Input, Op, Output, Stage
from .vit import VisionTransformer

SCALES = (4.0, 2.0, 1.0, 0.5)


def _resample(scale: float, dim: int) -> tuple[nn.Module, int]:
    """The layers that bring a stride-s map to stride s / `scale`, and their output width."""
    if scale == 4.0:
        half = dim // 2
        layers = [
            nn.ConvTranspose2d(dim, half, 2, stride=2),
            LayerNorm2d(half, eps=1e-6),
            nn.GELU(),
            nn.ConvTranspose2d(half, dim // 4, 2, stride=2),
        ]
        return nn.Sequential(*layers), dim // 4
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale == 0.5:
        return nn.MaxPool2d(2, stride=2), dim
    raise ValueError(f"scale {scale} is not one of ViTDet's {SCALES}; choose among them")


def _level(scale: float, dim: int, out_channels: int) -> nn.Sequential:
    """One pyramid level: resampling, then 1x1 conv + LN and 3x3 conv + LN (no conv bias
    before a norm, as detectron2)."""
    resample, width = _resample(scale, dim)
    return nn.Sequential(
        OrderedDict(
            resample=resample,
            lateral=nn.Conv2d(width, out_channels, 1, bias=False),
            lateral_norm=LayerNorm2d(out_channels, eps=1e-6),
            output=nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            output_norm=LayerNorm2d(out_channels, eps=1e-6),
        )
    )


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid over a vitkit ViT: images (B, C, H, W) -> an
    `OrderedDict` of maps '0', '1', ... (one per scale, finest first) and 'pool', each with
    `out_channels` channels, at the `strides` of its values (4, 8, 16, 32, 64 for patch 16);
    torchvision's detectors take it as their own FPN backbones.

    The model must be built with `dynamic_img_size=True`: detectors resize and pad the images
    to sizes of their own (multiples of 32). The ViT is used as it is (not copied); its
    classifier head is not run.

    Args:
        model: the ViT; its patch tokens at `block_index` make the stride-patch map.
        out_channels: channels of every output map (256 in the paper).
        scales: the levels, as multiples of the ViT map's resolution (ViTDet: 4, 2, 1, 0.5).
        block_index: the block to read (ViTDet: the last).
        norm: apply the ViT's final norm to that block's output (ViTDet does not).
        top_pool: add the 'pool' level, the last map max-pooled 2x (for the 5 anchor sizes of
            torchvision's detectors).
    """

    def __init__(
        self,
        model: VisionTransformer,
        *,
        out_channels: int = 256,
        scales: Sequence[float] = SCALES,
        block_index: int = -1,
        norm: bool = False,
        top_pool: bool = True,
    ) -> None:
        super().__init__()
        if not model.patch_embed.dynamic_img_size:
            raise ValueError(
                "SimpleFeaturePyramid needs a model built with dynamic_img_size=True: detectors "
                "resize and pad images to sizes of their own; pass dynamic_img_size=True to "
                "create_model or VisionTransformer"
            )
        if list(scales) != sorted(scales, reverse=True):
            raise ValueError(f"scales {tuple(scales)} must go from the finest down, e.g. {SCALES}")
        self.model = model
        self.block_index = block_index
        self.norm = norm
        self.top_pool = top_pool
        self.out_channels = out_channels
        self.levels = nn.ModuleList(_level(s, model.embed_dim, out_channels) for s in scales)
        reduction = model.patch_embed.reduction  # image pixels per token, (h, w)
        if reduction[0] != reduction[1]:
            raise ValueError(f"the ViT's map has strides {reduction}; the pyramid needs them equal")
        self.strides: dict[str, int] = {str(i): int(reduction[0] / s) for i, s in enumerate(scales)}
        if top_pool:
            self.strides["pool"] = 2 * self.strides[str(len(scales) - 1)]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """detectron2's init of the pyramid's convolutions (`c2_xavier_fill`): Kaiming-uniform
        with a = 1, zero biases; the norms start at ones and zeros."""
        for module in self.levels.modules():
            if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_uniform_(module.weight, a=1)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LayerNorm2d):
                module.reset_parameters()

    def vit_map(self, x: Tensor) -> Tensor:
        """Images (B, C, H, W) -> the ViT's map (B, D, H/ph, W/pw) at `block_index`."""
        return self.model.forward_intermediates(
            x, [self.block_index], norm=self.norm, intermediates_only=True, stop_early=True
        )[0]

    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        feature = self.vit_map(x)  # (B, D, H/ph, W/pw)
        maps: OrderedDict[str, Tensor] = OrderedDict()
        for i, level in enumerate(self.levels):
            maps[str(i)] = level(feature)  # (B, out_channels, H/stride, W/stride)
        if self.top_pool:
            last = maps[str(len(self.levels) - 1)]
            maps["pool"] = F.max_pool2d(last, kernel_size=1, stride=2)  # LastLevelMaxPool
        return maps

    def extra_repr(self) -> str:
        return f"out_channels={self.out_channels}, strides={self.strides}"

    def describe_flow(self, input_size: tuple[int, ...]) -> FlowSpec:
        """The forward pass for an input of `input_size` (B, C, H, W), stage by stage, for
        `vitkit.summary.flow`: the ViT's stages up to the block read, then the levels."""
        vit = self.model.describe_flow(input_size)
        last = take_indices(len(self.model.block_list()), [self.block_index])[0]
        unused = {"pool", "attn_pool", "fc_norm", "head", "head_dist", ""}
        if not self.norm:
            unused.add("norm")
        stages = [vit.stages[0]]  # the input
        for stage in vit.stages[1:]:
            if stage.name not in unused and (stage.block is None or stage.block <= last):
                stages.append(_under_model(stage))
        detail = f"block {last}'s patch tokens as a map"
        stages.append(
            Stage("model", "ViT map", detail, "(B, D, H/ph, W/pw)", Op("", ("permute",), -1))
        )
        for i, level in enumerate(self.levels):
            stages += _level_stages(self, i, level)
        if self.top_pool:
            detail = f"level {len(self.levels) - 1} subsampled 2x (LastLevelMaxPool)"
            measure = Op("", ("max_pool2d",), -1)
            stages.append(Stage("pool", "level pool", detail, "(B, C', H/s, W/s)", measure))
        return replace(
            vit,
            stages=tuple(stages),
            blocks=f"model.{vit.blocks}",
            patches=Output("model.patch_embed"),
            tokens=Output("model.patch_embed")
            if self.model.spatial_blocks
            else Input(f"model.{vit.blocks}.0"),
            legend=vit.legend + "; C' out_channels, s the level's stride",
        )


def _under_model(stage: Stage) -> Stage:
    """A ViT stage seen from the pyramid: its modules under `model.`; what the ViT's own
    `forward` ran (path ''), the pyramid's call of `forward_intermediates` runs."""

    def path(name: str) -> str:
        return f"model.{name}" if name else ""

    measure = stage.measure
    if isinstance(measure, Op):
        measure = replace(measure, scope=path(measure.scope))
    else:
        measure = replace(measure, path=path(measure.path))
    name = stage.name if stage.name.startswith(" ") else path(stage.name)
    return replace(stage, name=name, measure=measure)


def _level_stages(fpn: SimpleFeaturePyramid, index: int, level: nn.Sequential) -> list[Stage]:
    """One level: its resampling layers, then the 1x1 and 3x3 convolutions with their norms."""
    stride = fpn.strides[str(index)]
    layout = f"(B, C', H/{stride}, W/{stride})"
    pre = f"levels.{index}"
    resample = level.resample
    layers = list(resample.named_children()) if isinstance(resample, nn.Sequential) else []
    named = [(f"resample.{n}", m) for n, m in layers] or [("resample", resample)]
    named += [(n, m) for n, m in level.named_children() if n != "resample"]
    stages = []
    for name, module in named:
        if isinstance(module, nn.Identity):
            continue
        params = sum(p.numel() for p in module.parameters())
        stage = Stage(
            f"{pre}.{name}",
            f"level {index}",
            _layer_text(module),
            layout,
            Output(f"{pre}.{name}"),
            params,
        )
        stages.append(stage)
    return stages


def _layer_text(module: nn.Module) -> str:
    """A pyramid layer as a reader knows it: 'ConvTranspose2d 768->384, 2x2, stride 2'."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        kernel, stride = module.kernel_size, module.stride
        text = f"{type(module).__name__} {module.in_channels}->{module.out_channels}"
        return (
            text + f", {kernel[0]}x{kernel[1]}" + (f", stride {stride[0]}" if stride[0] > 1 else "")
        )
    if isinstance(module, nn.MaxPool2d):
        return f"MaxPool2d {module.kernel_size}x{module.kernel_size}, stride {module.stride}"
    return type(module).__name__
