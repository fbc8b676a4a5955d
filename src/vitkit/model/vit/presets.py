"""The ViT's presets: `vit_base_patch16_224` and every timm `VisionTransformer` name.

Sizes are the paper's Table 1 (Ti and S from DeiT); a name `vit_{size}_patch{P}_{res}` is a
size row plus the patch size and resolution, as big_vision decodes `B/16`.

timm's other `VisionTransformer` families (DeiT III, CLIP, SigLIP, DINOv2, registers, AIMv2,
BEiT-3, RADIO, ...) are rows of `FAMILIES`: a name template, the family's options, and the
size / patch / resolution variants timm registers, decoded over `TIMM_SIZES`. The names are
timm's and so are the architectures, parameter for parameter; the timm converter reads from a
name what weights cannot show (the activation, the block's norm placement, the pooling).
"""

from __future__ import annotations

from .config import ViTConfig
from .family import Family
from .presets_blocks import BLOCK_FAMILIES
from .presets_hybrid import HYBRID_FAMILIES
from .presets_vitamin import VITAMIN_FAMILIES

# The paper's names whose timm model has no head (timm's ':0' in the first row below) keep the
# paper's 1000-class ImageNet head, as the paper's Table 1 models have.
_PAPER_HEADS = ("vit_large_patch32_224", "vit_huge_patch14_224")

# Presets that are not a plain size/patch/resolution row.
_SPECIAL: dict[str, ViTConfig] = {
    # For the built-in 8x8 handwritten digits: 2x2 patches -> 16 tokens, 1 channel, 10 classes.
    "vit_digits": ViTConfig(
        img_size=8,
        patch_size=2,
        in_chans=1,
        num_classes=10,
        embed_dim=64,
        depth=4,
        num_heads=4,
        mlp_ratio=2.0,
        pos_embed="learn",
    ),
    # For 28x28 grey images (Fashion-MNIST, MNIST), sized by measurement for 2 CPU cores.
    "vit_mnist": ViTConfig(
        img_size=28,
        patch_size=7,
        in_chans=1,
        num_classes=10,
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
    ),
    # The paper's hybrid for the same images: three stride-2 conv layers (28 -> 14 -> 7 -> 4),
    # then 1x1 patches of the 4x4 feature map, so the same 16 tokens; it learns Fashion-MNIST
    # in a quarter of the epochs (README, "A real run").
    "vit_mnist_hybrid": ViTConfig(
        img_size=28,
        patch_size=1,
        in_chans=1,
        conv_stem=(32, 64, 128),
        num_classes=10,
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
    ),
}

_CLIP = dict(pre_norm=True, patch_bias=False, norm_eps=1e-5)
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False)
_REG_GAP = dict(class_token=False, no_embed_class=True, global_pool="avg", init_values=1e-5)
_MAP = dict(class_token=False, global_pool="map")
_TANH = dict(act_layer="gelu_tanh")
_SWIGLU_G = dict(mlp_layer="swiglu_packed", act_layer="silu")  # DINOv2-g's fused SwiGLU
_DINO_G = {"giant": (1536, 40, 24, 5.33334)}
_PLUS = {"base": (896, 12, 14, 4.0)}
_RADIO = dict(no_embed_class=True, final_norm=False)
_SO400M_TIPS = {"so400m": (1152, 27, 16, 4304 / 1152)}

FAMILIES: tuple[Family, ...] = (
    Family(
        "vit_{size}_patch{patch}_{res}",
        "tiny/16/224 tiny/16/384 small/32/224 small/32/384 small/16/224 small/16/384 "
        "small/8/224:0 base/32/224 base/32/384 base/16/224 base/16/384 base/8/224 "
        "large/32/224:0 large/32/384 large/16/224 large/16/384 large/14/224 huge/14/224:0 "
        "giant/14/224 gigantic/14/224",
    ),
    Family("vit_{size}_patch{patch}_{res}_miil", "base/16/224:11221", dict(qkv_bias=False)),
    Family(
        "vit_{size}_patch{patch}_36x1_{res}",
        "small/16/224",
        dict(init_values=1e-5),
        {"small": (384, 36, 6, 4.0)},
    ),
    Family(
        "vit_{size}_patch{patch}_plus_{res}",
        "base/16/240 base/32/256",
        dict(init_values=1e-5),
        _PLUS,
    ),
    Family(
        "vit_{size}_patch{patch}_rpn_{res}",
        "base/16/224",
        dict(
            res_post_norm=True,
            qkv_bias=False,
            init_values=1e-5,
            class_token=False,
            global_pool="avg",
        ),
    ),
    Family("deit_{size}_patch{patch}_{res}", "tiny/16/224 small/16/224 base/16/224 base/16/384"),
    Family(
        "deit3_{size}_patch{patch}_{res}",
        "small/16/224 small/16/384 medium/16/224 base/16/224 base/16/384 large/16/224 "
        "large/16/384 huge/14/224",
        dict(no_embed_class=True, init_values=1e-6),
    ),
    Family("flexivit_{size}", "small/16/240 base/16/240 large/16/240", dict(no_embed_class=True)),
    Family("eva_{size}_patch{patch}_{res}", "large/14/196 large/14/336", dict(global_pool="avg")),
    Family(
        "beit3_{size}_patch{patch}_{res}",
        "base/16/224 large/16/224 giant/14/224 giant/14/336",
        dict(scale_attn_norm=True, scale_mlp_norm=True, global_pool="avg", norm_eps=1e-5),
        {"giant": (1408, 40, 16, 4.3637)},
    ),
    Family(
        "vit_{size}_patch{patch}_gap_{res}",
        "medium/16/240:11821 medium/16/256 medium/16/384 betwixt/16/256",
        dict(_GAP, qkv_bias=False, init_values=1e-6),
    ),
    Family(
        "vit_{size}_patch{patch}_gap_{res}",
        "base/16/224 huge/14/224:0 huge/16/448:0 giant/16/224:0",
        _GAP,
        {"base": (768, 12, 16, 4.0)},
    ),
    Family(
        "vit_{size}_patch{patch}_reg1_gap_{res}",
        "betwixt/16/256 medium/16/256 little/16/256 wee/16/256",
        dict(_REG_GAP, reg_tokens=1),
    ),
    Family(
        "vit_{size}_patch{patch}_reg4_gap_{res}",
        "betwixt/16/256 betwixt/16/384 medium/16/256 mediumd/16/256 mediumd/16/384 little/16/256",
        dict(_REG_GAP, reg_tokens=4),
    ),
    Family(
        "vit_{size}_patch{patch}_reg4_gap_{res}",
        "base/16/256",
        dict(class_token=False, no_embed_class=True, global_pool="avg", reg_tokens=4),
    ),
    Family(
        "vit_{size}_patch{patch}_reg4_gap_{res}",
        "so150m/16/256 so150m/16/384",
        dict(_GAP, reg_tokens=4),
    ),
    Family("vit_{size}_patch{patch}_reg4_map_{res}", "so150m/16/256", dict(_MAP, reg_tokens=4)),
    Family(
        "vit_{size}_patch{patch}_reg1_gap_{res}",
        "so150m2/16/256 so150m2/16/384 so150m2/16/448",
        dict(class_token=False, global_pool="avg", reg_tokens=1, qkv_bias=False, init_values=1e-5),
    ),
    Family(
        "vit_{size}_patch{patch}_clip_{res}",
        "xsmall/16/224:512 medium/16/224:512 medium/32/224:512 betwixt/32/224:512 base/32/224 "
        "base/32/256:512 base/32/384 base/32/448 base/16/224 base/16/384 large/14/224 "
        "large/14/336 huge/14/224 huge/14/336 huge/14/378:1024 giant/14/224:1024 "
        "gigantic/14/224:1280 gigantic/14/378:1280",
        _CLIP,
    ),
    Family("vit_{size}_patch{patch}_plus_clip_{res}", "base/16/240:640", _CLIP, _PLUS),
    Family(
        "vit_{size}_patch{patch}_clip_quickgelu_{res}",
        "base/16/224:512 base/32/224:512 large/14/224:768 large/14/336:768 huge/14/224:1024 "
        "huge/14/378:1024 gigantic/14/224:1280",
        dict(_CLIP, act_layer="quick_gelu"),
    ),
    Family(
        "vit_{size}_patch{patch}_dinov2",
        "small/14/518 base/14/518 large/14/518",
        dict(init_values=1e-5),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_dinov2",
        "giant/14/518",
        dict(_SWIGLU_G, init_values=1e-5),
        _DINO_G,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_reg4_dinov2",
        "small/14/518 base/14/518 large/14/518",
        dict(init_values=1e-5, reg_tokens=4, no_embed_class=True),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_reg4_dinov2",
        "giant/14/518",
        dict(_SWIGLU_G, init_values=1e-5, reg_tokens=4, no_embed_class=True),
        _DINO_G,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_reg1_tipsv2",
        "base/14/448 large/14/448 so400m/14/448",
        dict(init_values=1.0, reg_tokens=1, no_embed_class=True),
        _SO400M_TIPS,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_reg1_tipsv2",
        "giant/14/448",
        dict(_SWIGLU_G, init_values=1.0, reg_tokens=1, no_embed_class=True),
        _DINO_G,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_radio_v3",
        "base/16/512 large/16/512",
        dict(_RADIO, reg_tokens=7, init_values=1e-5),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_radio_v3",
        "huge/16/512 giant/16/512",
        dict(_RADIO, reg_tokens=7),
        {"giant": (1536, 40, 24, 4.0)},
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_radio_v4",
        "huge/16/512 so400m/16/512",
        dict(_RADIO, reg_tokens=9),
        _SO400M_TIPS,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_{res}",
        "intern300m/14/448",
        dict(init_values=0.1, final_norm=False, dynamic_img_size=True),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_siglip_{res}",
        "base/16/224 base/16/256 base/16/384 base/16/512 large/16/256 large/16/384 "
        "so400m/14/224 so400m/14/378",
        _MAP,
        classes=0,
    ),
    Family(  # the SigLIP 2 weights: GELU's tanh approximation
        "vit_{size}_patch{patch}_siglip_{res}",
        "base/32/256 large/16/512 so400m/16/256 so400m/16/384 so400m/16/512 giantopt/16/256 "
        "giantopt/16/384",
        dict(_MAP, **_TANH),
        classes=0,
    ),
    Family(  # 384 is no multiple of 14: a 27 x 27 grid, the last 6 pixels dropped (as timm)
        "vit_{size}_patch{patch}_siglip_{res}",
        "so400m/14/384",
        dict(_MAP, floor_grid=True),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_siglip_gap_{res}",
        "so400m/14/384",
        dict(_GAP, floor_grid=True),
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_siglip_gap_{res}",
        "base/16/224 base/16/256 base/16/384 base/16/512 large/16/256 large/16/384 "
        "so400m/14/224 so400m/14/378 so400m/14/448 so400m/14/896",
        _GAP,
        classes=0,
    ),
    Family(
        "vit_{size}_patch{patch}_siglip_gap_{res}",
        "base/32/256 large/16/512 so400m/16/256 so400m/16/384 so400m/16/512 giantopt/16/256 "
        "giantopt/16/384",
        dict(_GAP, **_TANH),
        classes=0,
    ),
    Family(
        "aimv2_{size}_patch{patch}_{res}",
        " ".join(f"{s}/14/{r}" for s in ("large", "huge", "1b", "3b") for r in (224, 336, 448)),
        dict(
            _GAP,
            qkv_bias=False,
            proj_bias=False,
            act_layer="silu",
            mlp_layer="swiglu",
            norm_layer="rmsnorm",
            norm_eps=1e-5,
            embed_norm=True,
        ),
        {
            "large": (1024, 24, 8, 2.75),
            "huge": (1536, 24, 12, 2.6667),
            "1b": (2048, 24, 16, 2.75),
            "3b": (3072, 24, 24, 2.6667),
        },
        classes=0,
    ),
)

_FAMILY_CONFIGS: dict[str, ViTConfig] = {
    name: config
    for family in FAMILIES + HYBRID_FAMILIES + BLOCK_FAMILIES + VITAMIN_FAMILIES
    for name, config in family.configs().items()
}

# timm names whose architecture vitkit does not implement, with the reason.
_RESNET_D = (
    "a ResNet-D backbone (timm's resnet.py: BatchNorm, a deep stem, average-pool shortcuts), "
    "not the paper's ResNetV2 (vitkit's hybrids: vit_*_r50_*, vit_*_r26_*)"
)
UNSUPPORTED_NAMES = {
    **{
        name: _RESNET_D
        for name in (
            "vit_small_resnet26d_224",
            "vit_small_resnet50d_s16_224",
            "vit_base_resnet26d_224",
            "vit_base_resnet50d_224",
        )  # fmt: skip
    },
    "vit_base_mci_224": "MobileCLIP's stem (4x4 / 2x2 convolutions with BatchNorm and GELU, no "
    "patch projection), untrained in timm",
}


def vit_presets() -> dict[str, ViTConfig]:
    """Every ViT name -> its config: timm's family rows, the paper's names (which keep a
    1000-class head where timm's model has none) and vitkit's own small presets."""
    paper = {name: _FAMILY_CONFIGS[name].replace(num_classes=1000) for name in _PAPER_HEADS}
    return {**_FAMILY_CONFIGS, **paper, **_SPECIAL}
