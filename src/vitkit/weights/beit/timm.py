"""BEiT weights from timm (`beit.py`): a state dict, a file or a Hub folder, and the original
layout (microsoft/unilm's `beit`, `beit2`) timm's `checkpoint_filter_fn` reads. vitkit's `Beit`
has timm's module and parameter names, so timm's keys are kept: the keys are told from a ViT's,
an EVA's and a Swin's, the sizes read from the tensors, and every key and shape checked before
anything loads.

BEiT's keys are told by a relative position table beside a class token (a Swin's tables sit in
`layers.N`, and it has no class token): `blocks.0.attn.relative_position_bias_table` or the
shared `rel_pos_bias.relative_position_bias_table`. A BEiT with neither (absolute positions
only) has keys an EVA's or a ViT's have too, and is read as theirs.

The tensors show every size timm's `Beit` takes: the width, depth, patch, channels and classes,
the heads (the tables' columns), the MLP's width and kind, the q / v biases, LayerScale, which
tables there are, the pooling's norm and the grid (the tables' or the position embedding's). They
do not show LayerScale's initial value, nor the grid of an oblong input (`img_size=(h, w)`), nor
the heads of a BEiT without tables (`num_heads=` or `arch=`); the norm epsilon is timm's 1e-6.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ...model import build_model, find_architecture, get_config
from ...model.beit import BeitConfig
from ..checkpoint import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    mismatch_report,
    strip_prefix,
)

log = logging.getLogger(__name__)

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
BLOCK_TABLE = "blocks.0.attn.relative_position_bias_table"
SHARED_TABLE = "rel_pos_bias.relative_position_bias_table"
# Parts of an original pre-training checkpoint no classifier has: the mask token and the masked
# image modelling head.
_PRETRAINING = re.compile(r"mask_token|lm_head\..*")


def is_beit_state_dict(keys: Sequence[str]) -> bool:
    """Whether the keys (timm's layout, or the original one) are a BEiT's: a relative position
    table beside a class token."""
    keys = {k.removeprefix("module.") for k in keys}
    return "cls_token" in keys and (BLOCK_TABLE in keys or SHARED_TABLE in keys)


def beit_layout(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """timm's keys: without a DDP `module.` prefix, the saved index buffers
    (`relative_position_index`, rebuilt by the model) and an original pre-training
    checkpoint's mask token and MIM head (dropped, as BEiT's fine-tuning code drops them)."""
    sd = strip_prefix(state_dict, "module.")
    dropped = [k for k in sd if _PRETRAINING.fullmatch(k)]
    if dropped:
        log.info("dropping the pre-training parts of the checkpoint: %s", ", ".join(dropped))
    return {
        k: v
        for k, v in sd.items()
        if not k.endswith("relative_position_index") and k not in dropped
    }


def _depth(sd: Mapping[str, Tensor]) -> int:
    blocks = {int(m[1]) for m in map(_BLOCK.match, sd) if m}
    return max(blocks) + 1 if blocks else 0


def _mlp_ratio(named: BeitConfig | None, dim: int, hidden: int) -> float:
    """The ratio that gives the hidden width `hidden` at width `dim` (timm: `int(dim *
    ratio)`): the name's where it does."""
    if named is not None and int(dim * named.mlp_ratio) == hidden:
        return named.mlp_ratio
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else (hidden + 0.5) / dim


def _table_grid(rows: int) -> int | None:
    """The side of the square grid a table of `rows` (BEiT's three class rows included) is
    made for, or None."""
    side = math.isqrt(rows - 3)
    return (side + 1) // 2 if side * side == rows - 3 and side % 2 else None


def _img_size(sd: Mapping[str, Tensor], named: BeitConfig | None, patch: int) -> Any:
    """The image size the tables or the position embedding are made for: the name's when its
    grid agrees, else the square they hold; None where nothing tells it."""
    table = sd.get(BLOCK_TABLE, sd.get(SHARED_TABLE))
    side = None if table is None else _table_grid(table.shape[0])
    if table is None and "pos_embed" in sd:
        patches = sd["pos_embed"].shape[1] - 1
        root = math.isqrt(patches)
        side = root if root * root == patches else None
    if named is not None and patch == named.patch_size:
        rows, cols = named.grid_size
        if table is not None and table.shape[0] == (2 * rows - 1) * (2 * cols - 1) + 3:
            return named.img_size
        if table is None and "pos_embed" in sd and sd["pos_embed"].shape[1] == rows * cols + 1:
            return named.img_size
    return None if side is None else side * patch


def shown_options(sd: Mapping[str, Tensor], named: BeitConfig | None) -> dict[str, Any]:
    """The `BeitConfig` fields the tensors show (see the module's docstring)."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    dim, patch = proj.shape[0], proj.shape[2]
    table = sd.get(BLOCK_TABLE, sd.get(SHARED_TABLE))
    scaled = "blocks.0.gamma_1" in sd
    shown: dict[str, Any] = {
        "embed_dim": dim,
        "in_chans": proj.shape[1],
        "patch_size": patch,
        "depth": _depth(sd),
        "num_classes": sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        "mlp_ratio": _mlp_ratio(named, dim, sd["blocks.0.mlp.fc2.weight"].shape[1]),
        "swiglu_mlp": "blocks.0.mlp.fc1_g.weight" in sd,
        "scale_mlp": "blocks.0.mlp.norm.weight" in sd,
        "qkv_bias": "blocks.0.attn.q_bias" in sd,
        "init_values": ((named and named.init_values) or 0.1) if scaled else None,
        "use_abs_pos_emb": "pos_embed" in sd,
        "use_rel_pos_bias": BLOCK_TABLE in sd,
        "use_shared_rel_pos_bias": SHARED_TABLE in sd,
        "use_fc_norm": "fc_norm.weight" in sd,
        "global_pool": "avg" if "fc_norm.weight" in sd else "token",
    }
    if table is not None:
        shown["num_heads"] = table.shape[1]
    size = _img_size(sd, named, patch)
    if size is not None:
        shown["img_size"] = size
    return shown


def _named(arch: str | None) -> BeitConfig | None:
    if arch is None:
        return None
    named = get_config(arch)
    if not isinstance(named, BeitConfig):
        title = find_architecture(named).title
        raise ArchMismatchError(arch, f"the keys of timm's beit.py, and it is a {title} name")
    return named


def beit_config(
    sd: Mapping[str, Tensor], arch: str | None, overrides: Mapping[str, Any]
) -> BeitConfig:
    """The config of timm BEiT weights: what they show, over the config of `arch` (a BEiT
    name of `vitkit.list_models()`, optional) and under the `overrides` (`BeitConfig`
    fields)."""
    named = _named(arch)
    options = {**shown_options(sd, named), **overrides}
    if "num_heads" not in options and named is None:
        raise MissingOptionError(
            "BEiT weights without relative position tables do not show their head count",
            ("num_heads",),
            ("arch",),
        )
    if "img_size" not in options:
        raise MissingOptionError(
            "the BEiT weights' tables are not of a square grid", ("img_size",), ("arch",)
        )
    source = f"timm BEiT weights read as {arch}" if arch else "timm BEiT weights"
    try:
        config = (named or BeitConfig()).replace(**options)
    except ValueError as err:
        raise CheckpointError(f"{source}: {err}") from None
    with torch.device("meta"):
        expected = {k: v.shape for k, v in build_model(config).state_dict().items()}
    report = mismatch_report(expected, sd)
    if report:
        raise CheckpointError(f"{source} do not load ({report}); pass the arch= they were made for")
    return config


def from_timm_beit(
    state_dict: Mapping[str, Tensor], *, arch: str | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], BeitConfig]:
    """A timm BEiT state dict in timm's layout and its `BeitConfig`.

    Args:
        state_dict: the weights (timm's keys, or the original layout; DDP's `module.` prefix).
        arch: the timm name they were made for ('beitv2_base_patch16_224'): its LayerScale
            start and what weights without tables do not show (their heads).
        overrides: `BeitConfig` fields over both (a timm folder's `model_args`, `num_heads`).
    """
    sd = beit_layout(state_dict)
    fields = BeitConfig.__dataclass_fields__
    options = {k: v for k, v in overrides.items() if k in fields and v is not None}
    return sd, beit_config(sd, arch, options)
