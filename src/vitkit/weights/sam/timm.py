"""SAM ViT weights from timm (`vision_transformer_sam.py`): a state dict, a file or a Hub folder,
and Meta's original Segment Anything checkpoints (`sam_vit_b_01ec64.pth`: `image_encoder.`
keys beside the prompt encoder's and the mask decoder's), moved as timm's `checkpoint_filter_fn`
moves them. vitkit's `SamViT` has timm's module and parameter names, so timm's keys are kept.

A SAM ViT's keys are told by its neck (`neck.0.weight`, or the `neck.weight` LayerNorm2d that
replaces it), which no other family has. The weights show almost every size: width, depth,
patch, channels, classes, MLP width, neck channels, the position grid, and with relative
positions the head width (`rel_pos_h` is (2 s - 1, head_dim)), the window and which blocks are
global (their tables span the grid). What they cannot show (the heads without relative
positions, the window without them, the dropouts, the pooling) comes from the name (`arch=`),
else from SAM ViT-B's (the sizes the weights show win over the name's, as for an EVA); a
name of another family is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...model import build_model, find_architecture, get_config, list_models
from ...model.sam import SamConfig
from ..checkpoint import ArchMismatchError, CheckpointError, mismatch_report, strip_prefix

ORIGINAL_PREFIX = "image_encoder."
DEFAULT_ARCH = "samvit_base_patch16"


def original_keys(keys: Any) -> bool:
    """Whether the keys are Meta's Segment Anything checkpoint's."""
    return f"{ORIGINAL_PREFIX}patch_embed.proj.weight" in keys


def is_sam_state_dict(keys: Any) -> bool:
    """Whether the keys (timm's layout or the original) are a SAM ViT's."""
    keys = {k.removeprefix("module.") for k in keys}
    has_neck = "neck.0.weight" in keys or "neck.weight" in keys
    return original_keys(keys) or (has_neck and "patch_embed.proj.weight" in keys)


def timm_sam_layout(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """timm's keys: without a DDP `module.` prefix; an original checkpoint's image encoder
    without its prefix, `mlp.lin1` / `lin2` as `mlp.fc1` / `fc2`, the rest of SAM dropped
    (timm's `checkpoint_filter_fn`)."""
    sd = strip_prefix(state_dict, "module.")
    if not original_keys(sd):
        return sd
    return {
        k.removeprefix(ORIGINAL_PREFIX).replace("mlp.lin", "mlp.fc"): v
        for k, v in sd.items()
        if k.startswith(ORIGINAL_PREFIX)
    }


def _depth(sd: Mapping[str, Tensor]) -> int:
    return len({k.split(".")[1] for k in sd if k.startswith("blocks.")})


def _windows(sd: Mapping[str, Tensor], depth: int, grid: int | None) -> dict[str, Any]:
    """The window side and global blocks the relative-position tables show: a global block's
    table spans the grid (2 * grid - 1 rows), a window block's the window."""
    lengths = [sd[f"blocks.{i}.attn.rel_pos_h"].shape[0] for i in range(depth)]
    if grid is None or len(set(lengths)) < 2:
        return {}
    global_length = 2 * grid - 1
    window = next(n for n in lengths if n != global_length)
    return {
        "window_size": (window + 1) // 2,
        "global_attn_indexes": tuple(i for i, n in enumerate(lengths) if n == global_length),
    }


def _grid_rows(sd: Mapping[str, Tensor], depth: int) -> int | None:
    """The rows of the patch grid the weights were made for: the position map's, else the
    longest relative-position table's (a global block's)."""
    if "pos_embed" in sd:
        return sd["pos_embed"].shape[1]
    lengths = [sd[f"blocks.{i}.attn.rel_pos_h"].shape[0] for i in range(depth)]
    if "blocks.0.attn.rel_pos_h" in sd and len(set(lengths)) > 1:
        return (max(lengths) + 1) // 2
    return None


def shown_options(sd: Mapping[str, Tensor], named: SamConfig) -> dict[str, Any]:
    """The `SamConfig` options the tensors show."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    dim, depth, patch = proj.shape[0], _depth(sd), proj.shape[2]
    rel_pos = "blocks.0.attn.rel_pos_h" in sd
    shown: dict[str, Any] = {
        "embed_dim": dim,
        "in_chans": proj.shape[1],
        "patch_size": patch,
        "depth": depth,
        "mlp_ratio": sd["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd,
        "qk_norm": "blocks.0.attn.q_norm.weight" in sd,
        "pre_norm": "norm_pre.weight" in sd,
        "use_abs_pos": "pos_embed" in sd,
        "use_rel_pos": rel_pos,
        "neck_chans": sd["neck.0.weight"].shape[0] if "neck.0.weight" in sd else 0,
        "num_classes": sd["head.fc.weight"].shape[0] if "head.fc.weight" in sd else 0,
    }
    if "blocks.0.ls1.gamma" in sd:
        shown["init_values"] = named.init_values or 1e-5  # the value is the weights'
    else:
        shown["init_values"] = None
    head_dim = sd["blocks.0.attn.rel_pos_h"].shape[1] if rel_pos else None
    if "blocks.0.attn.q_norm.weight" in sd:
        head_dim = sd["blocks.0.attn.q_norm.weight"].shape[0]
    if head_dim:
        shown["num_heads"] = dim // head_dim
    rows = _grid_rows(sd, depth)
    if rows is not None:
        cols = sd["pos_embed"].shape[2] if "pos_embed" in sd else rows
        shown["img_size"] = (rows * patch, cols * patch) if rows != cols else rows * patch
    if rel_pos:
        shown.update(_windows(sd, depth, rows))
    return shown


def sam_config(
    sd: Mapping[str, Tensor], arch: str | None, overrides: Mapping[str, Any]
) -> SamConfig:
    """The config of timm SAM ViT weights: what they show over the config of `arch` (SAM
    ViT-B's without one) and the `overrides` (`SamConfig` fields), checked key by key."""
    named = get_config(arch or DEFAULT_ARCH)
    if not isinstance(named, SamConfig):
        title = find_architecture(named).title
        what = f"the keys of timm's vision_transformer_sam.py, not a {title}'s"
        raise ArchMismatchError(arch, what)
    shown = {**shown_options(sd, named), **overrides}
    kept = tuple(i for i in named.global_attn_indexes if i < shown["depth"])
    shown.setdefault("global_attn_indexes", kept)
    try:
        config = named.replace(**shown)
    except ValueError as err:
        name = arch or DEFAULT_ARCH
        raise CheckpointError(f"timm SAM ViT weights read as {name}: {err}") from None
    with torch.device("meta"):
        expected = {k: v.shape for k, v in build_model(config).state_dict().items()}
    report = mismatch_report(expected, sd)
    if report:
        raise CheckpointError(
            f"timm SAM ViT weights do not match {arch or DEFAULT_ARCH} at their sizes ({report}); "
            "pass the arch= and the window_size / num_heads they were made for"
        )
    return config


def from_timm_sam(
    state_dict: Mapping[str, Tensor], *, arch: str | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], SamConfig]:
    """A timm (or original Segment Anything) SAM ViT state dict in timm's layout and its
    `SamConfig`.

    Args:
        state_dict: the weights (timm's keys, DDP's `module.` prefix, or the original
            checkpoint's `image_encoder.` keys).
        arch: the timm name they were made for ('samvit_base_patch16'); it gives what the
            weights do not show.
        overrides: `SamConfig` fields over both (a timm folder's `model_args`, `num_heads`).
    """
    sd = timm_sam_layout(state_dict)
    if arch is not None and arch not in list_models():
        raise CheckpointError(f"unknown model name {arch!r}; see vitkit.list_models('samvit_*')")
    fields = SamConfig.__dataclass_fields__
    options = {k: v for k, v in overrides.items() if k in fields and v is not None}
    return sd, sam_config(sd, arch, options)
