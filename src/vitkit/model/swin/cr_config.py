"""`SwinCrConfig`: timm's Swin V2-cr (`swin_transformer_v2_cr.py`, Christoph Reich's
re-implementation of Liu et al., "Swin Transformer V2", CVPR 2022) as the options it adds to
`SwinConfig`.

Why a subclass and not more options of `SwinConfig`: the shared concepts (sizes, depths, heads,
windows, drops, pooling, dynamic sizes) are declared once, in `SwinConfig`, and the cr config
inherits them; what only cr has (windows derived from the patch grid, the extra main-branch
norms, the initial scale of the res-post norms) is declared here, so V1 / V2 configs and their
`--help` do not carry options they ignore. `isinstance(config, SwinConfig)` holds, so every
Swin path (loading, saving, the refusals of what does not cover a Swin yet) takes cr too;
its architecture record (`SWIN_CR`, swin/__init__.py) builds the model class.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...options import FRACTION, Range, option
from .config import SwinConfig, _per_stage

_WINDOW = Range(0, 65536, note="(0: the patch grid divided by window_ratio)")


@dataclass(frozen=True, kw_only=True)
class SwinCrConfig(SwinConfig):
    """The architecture of a `SwinTransformerV2Cr`: Swin V2's cosine attention and res-post
    norms, with a position-bias meta network over log offsets, a pre-norm patch merging, no
    final norm but extra norms on the main branch; defaults are timm's `SwinTransformerV2Cr`."""

    version: int = option(
        2, "always 2: cr is a layout of Swin V2 (cosine attention, res-post-norm)",
        choices=(2,), group="architecture",
    )  # fmt: skip
    window_size: int | tuple[int, ...] = option(
        0,
        "attention window side, one for every stage or one per stage (0: the patch grid "
        "divided by window_ratio, per side); a window no smaller than a stage's map is clamped",
        range=_WINDOW,
        metavar="N",
        group="shape",
    )
    window_ratio: int | tuple[int, ...] = option(
        8, "with window_size 0: each stage's window is the patch grid (before downsampling) "
        "divided by this, per side (timm's window_ratio)",
        range=Range(1, 65536), metavar="N", group="shape",
    )  # fmt: skip
    drop_path_rate: float = option(
        0.0, "stochastic depth at the last block, rising linearly from 0 at the first",
        range=FRACTION, group="regularisation",
    )  # fmt: skip
    extra_norm_period: int = option(
        0, "a LayerNorm on the main branch after every N-th block of a stage (0: none; "
        "timm's huge / giant: 6)",
        range=Range(0, 1024), group="architecture",
    )  # fmt: skip
    extra_norm_stage: bool = option(
        False, "a LayerNorm on the main branch after the last block of every stage (timm's "
        "'ns' names; the last stage always ends with one)",
        group="architecture",
    )  # fmt: skip
    init_values: float | None = option(
        0.0, "initial scale of each block's res-post norms (None: LayerNorm's 1)",
        range=Range(0), group="architecture",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pretrained_window_sizes not in (0, (0,)) or not self.qkv_bias:
            raise ValueError(
                "Swin V2-cr has no pre-training windows and always a qkv bias; leave "
                "pretrained_window_sizes at 0 and qkv_bias at True"
            )
        ratio = self.window_ratio
        if isinstance(ratio, tuple) and len(ratio) not in (1, self.num_stages):
            raise ValueError(
                f"window_ratio {ratio!r} has {len(ratio)} entries for {self.num_stages} "
                "stages; give one per stage"
            )

    @property
    def stage_windows(self) -> tuple[tuple[int, int], ...]:
        """The (h, w) window of each stage before clamping: window_size, or the patch grid
        divided by window_ratio (at least 1), as timm's `window_sizes_from_ratio`."""
        sizes = _per_stage(self.window_size, self.num_stages)
        ratios = _per_stage(self.window_ratio, self.num_stages)
        grid = self.grid_size
        return tuple(
            (size, size) if size else (max(1, grid[0] // ratio), max(1, grid[1] // ratio))
            for size, ratio in zip(sizes, ratios)
        )

    def extra_norm(self, stage: int, block: int) -> bool:
        """Whether block `block` of `stage` ends with a main-branch norm (timm's `norm3`):
        every `extra_norm_period`-th block, and the last block of every stage with
        `extra_norm_stage` (of the last stage always)."""
        count = block + 1
        if self.extra_norm_period and count % self.extra_norm_period == 0:
            return True
        ends_stage = self.extra_norm_stage or stage == self.num_stages - 1
        return ends_stage and count == self.depths[stage]
