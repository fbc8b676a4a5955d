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

import torch.nn.functional as F
from torch import Tensor, nn

from .layers import LayerNorm2d
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
