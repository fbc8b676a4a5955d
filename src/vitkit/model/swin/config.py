"""`SwinConfig`: every choice that defines a Swin Transformer, declared once with `option()`
as `ViTConfig` is, and the geometry of its stages (one function for each stage's feature map
and window).

Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows" (ICCV
2021) is version 1; "Swin Transformer V2: Scaling Up Capacity and Resolution" (CVPR 2022) is
version 2 (cosine attention, continuous position bias, res-post-norm). The names and the
defaults are timm's (`SwinTransformer`, `SwinTransformerV2`), so timm's weights load key for key.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, POSITIVE, Options, Range, option
from ..layers.mlp import ACT_LAYERS
from ..layers.patch_embed import to_2tuple

SWIN_VERSIONS = (1, 2)
SWIN_POOLS = ("avg", "max", "avgmax", "none")
SWIN_WINDOW_RULES = ("timm", "hf", "torchvision")
_SIDE = Range(1, 65536)


@dataclass(frozen=True, kw_only=True)
class SwinConfig(Options):
    """The architecture of a `SwinTransformer`; defaults are Swin-T (V1) at 224 (paper Table 7)."""

    NOUN = "model option"
    GROUPS = {
        "shape": "model shape (default: the preset's)",
        "regularisation": "model regularisation (default: the preset's)",
        "architecture": "model architecture (default: the preset's)",
    }

    version: int = option(
        1,
        "1: scaled dot-product attention with a learned relative-position-bias table, "
        "pre-norm blocks; 2: cosine attention with a clamped logit scale, a position-bias MLP "
        "over log-spaced offsets and res-post-norm blocks",
        choices=SWIN_VERSIONS,
        group="architecture",
    )
    img_size: int | tuple[int, int] = option(
        224, "input size: N or H W", range=_SIDE, metavar="N", group="shape"
    )
    patch_size: int = option(4, "patch size of the embedding", range=_SIDE, group="shape")
    in_chans: int = option(3, "input channels", range=Range(1, 4096), group="shape")
    num_classes: int = option(
        1000, "head outputs; 0: pooled features only", range=Range(0, 10_000_000), group="shape"
    )
    embed_dim: int = option(
        96, "width of the first stage; each later stage doubles it", range=_SIDE, group="shape"
    )
    depths: tuple[int, ...] = option(
        (2, 2, 6, 2), "blocks per stage", range=Range(1, 1024), metavar="N", group="shape"
    )
    num_heads: tuple[int, ...] = option(
        (3, 6, 12, 24), "attention heads per stage", range=_SIDE, metavar="N", group="shape"
    )
    window_size: int | tuple[int, ...] = option(
        7,
        "attention window side: one for every stage or one per stage (a window no smaller "
        "than a stage's feature map is clamped to it and not shifted)",
        range=_SIDE,
        metavar="N",
        group="shape",
    )
    pretrained_window_sizes: int | tuple[int, ...] = option(
        0,
        "version 2: the window each stage was pre-trained with, which scales the position-bias "
        "coordinates (0: the window itself); one for every stage or one per stage",
        range=Range(0, 65536),
        metavar="N",
        group="architecture",
    )
    mlp_ratio: float = option(4.0, "MLP hidden width as a multiple of the stage width",
                              range=POSITIVE, group="shape")  # fmt: skip
    qkv_bias: bool = option(True, "bias in the qkv projection (version 2: q and v only)",
                            group="architecture")  # fmt: skip
    drop_rate: float = option(0.0, "dropout before the head", range=FRACTION,
                              group="regularisation")  # fmt: skip
    proj_drop_rate: float = option(0.0, "dropout after the attention projection and the MLP",
                                   range=FRACTION, group="regularisation")  # fmt: skip
    attn_drop_rate: float = option(0.0, "dropout on the attention weights", range=FRACTION,
                                   group="regularisation")  # fmt: skip
    drop_path_rate: float = option(
        0.1, "stochastic depth at the last block, rising linearly from 0 at the first (timm's 0.1)",
        range=FRACTION, group="regularisation",
    )  # fmt: skip
    global_pool: str = option(
        "avg", "'avg', 'max', 'avgmax' over the last feature map, or 'none' (the head sees it)",
        choices=SWIN_POOLS, group="architecture",
    )  # fmt: skip
    always_partition: bool = option(
        False, "always partition into windows and shift, even where a window covers the map",
        group="architecture",
    )  # fmt: skip
    dynamic_img_size: bool = option(
        False,
        "accept inputs of other sizes (multiples of the patch size), building the shift masks "
        "per input (timm's strict_img_size=False)",
        group="architecture",
    )
    windows_like: str = option(
        "timm",
        "how a map that is not whole windows is windowed: 'timm' (rolled, then padded; a "
        "window no smaller than the map clamped to it), 'hf' (Hugging Face: padded, then "
        "rolled; clamped as timm's) or 'torchvision' (padded, then rolled; never clamped, no "
        "shift on a side the window covers, decided per input under dynamic_img_size)",
        choices=SWIN_WINDOW_RULES, group="architecture",
    )  # fmt: skip
    dynamic_img_pad: bool = option(
        False,
        "pad an image whose sides are not multiples of the patch size on the right and "
        "bottom to whole patches (Hugging Face's Swin; timm's dynamic_img_pad)",
        group="architecture",
    )
    act_layer: str = option("gelu", "the MLP activation", choices=ACT_LAYERS,
                            group="architecture")  # fmt: skip
    norm_eps: float = option(1e-5, "epsilon of every LayerNorm", range=POSITIVE,
                             group="architecture")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        stages = len(self.depths)
        for name in ("num_heads", "window_size", "pretrained_window_sizes"):
            value = getattr(self, name)
            per_stage = isinstance(value, tuple) and len(value) != 1
            if name == "num_heads" and len(value) != stages or per_stage and len(value) != stages:
                raise ValueError(
                    f"{name} {value!r} has {len(value)} entries for {stages} stages "
                    f"(depths {self.depths!r}); give one per stage"
                )
        for i, heads in enumerate(self.num_heads):
            width = self.stage_dims[i]
            if width % heads:
                raise ValueError(
                    f"stage {i} is {width} wide, not divisible by its {heads} heads; choose "
                    f"num_heads among the divisors of {width}"
                )
        to_2tuple(self.img_size, "img_size")

    @property
    def num_stages(self) -> int:
        return len(self.depths)

    @property
    def stage_dims(self) -> tuple[int, ...]:
        """The width of each stage: embed_dim doubled at every patch merging."""
        return tuple(self.embed_dim * 2**i for i in range(self.num_stages))

    @property
    def num_features(self) -> int:
        """The width of the last stage, which the head reads."""
        return self.stage_dims[-1]

    @property
    def windows(self) -> tuple[int, ...]:
        """The window side of each stage, as configured (before clamping to the map)."""
        return _per_stage(self.window_size, self.num_stages)

    @property
    def pretrained_windows(self) -> tuple[int, ...]:
        """The pre-training window of each stage (0: none)."""
        return _per_stage(self.pretrained_window_sizes, self.num_stages)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at `img_size`; the patches are cut by the floor, as
        timm's strided convolution does with a size that is not a multiple (with
        `dynamic_img_pad`, a partial patch counts: the image is padded to it)."""
        height, width = to_2tuple(self.img_size, "img_size")
        if self.dynamic_img_pad:
            return -(-height // self.patch_size), -(-width // self.patch_size)
        return height // self.patch_size, width // self.patch_size

    def stage_resolution(self, stage: int) -> tuple[int, int]:
        """The feature map of `stage` at `img_size`: the patch grid, halved (rounding up) by
        each patch merging at the start of stages 1, 2, ..."""
        return stage_resolution(self.grid_size, stage)


def stage_resolution(grid: tuple[int, int], stage: int) -> tuple[int, int]:
    """The feature map of `stage` for a patch grid: halved, rounding up, at the start of each
    stage after the first (timm's PatchMerging pads odd sides)."""
    height, width = grid
    for _ in range(stage):
        height, width = (height + 1) // 2, (width + 1) // 2
    return height, width


def _per_stage(value: int | tuple[int, ...], stages: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * stages
    return tuple(value) * stages if len(value) == 1 else tuple(value)
