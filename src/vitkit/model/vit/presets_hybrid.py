"""timm's hybrid ViTs (Dosovitskiy et al., ICLR 2021, Section 3.1; Steiner et al., "How to
train your ViT?", 2021): a ResNet (BiT's ResNetV2, layers/resnetv2.py) before the patch
projection, whose feature map is cut into patches of 1 (or 8, on the stem alone) pixels.

R50 keeps three stages (3, 4, 9 blocks: 16 pixels per token), R26 four (2 each: 32 pixels);
`vit_tiny_r_s16_p8_*` has the stem alone (4 pixels) and 8-pixel patches. The names are timm's,
parameter for parameter; its `vit_*_resnet26d/50d_*` and `vit_base_mci_224` use other CNNs
(registry.py's `UNSUPPORTED_NAMES` says so).
"""

from __future__ import annotations

from .family import Family

_R50 = dict(hybrid="resnetv2", hybrid_layers=(3, 4, 9))
_R26 = dict(hybrid="resnetv2", hybrid_layers=(2, 2, 2, 2))
_R50_S32 = dict(hybrid="resnetv2", hybrid_layers=(3, 4, 6, 3))

HYBRID_FAMILIES: tuple[Family, ...] = (
    Family("vit_{size}_r_s16_p{patch}_{res}", "tiny/8/224 tiny/8/384", dict(hybrid="resnetv2")),
    Family("vit_{size}_r26_s32_{res}", "small/1/224 small/1/384 base/1/224", _R26),
    Family("vit_{size}_r50_s16_{res}", "base/1/224:0 base/1/384", _R50),
    Family("vit_{size}_r50_s32_{res}", "large/1/224 large/1/384", _R50_S32),
)
