"""Swin Transformer weights from timm (`swin_transformer.py`, `swin_transformer_v2.py`): a
state dict, a file, a Hub folder, or the original Microsoft layout (downsampling at the end of
a stage), as timm's `checkpoint_filter_fn` remaps it.

A Swin is told from a ViT by its keys (`layers.N.blocks.M.attn.relative_position_bias_table`
for V1, `...attn.logit_scale` for V2). The weights show the version, the width, the depths,
the heads (bias-table or logit-scale shapes), the MLP ratio, the patch size, the head and the
V1 windows (a table of (2w - 1)^2 rows); they do not show the image size, nor V2's windows and
pre-training windows: `arch=` (a timm name) or the options give those, else the load is
refused in one line.

timm's V2-cr (`swin_transformer_v2_cr.py`) is told by `stages.N.blocks.M.attn.meta_mlp` (or
`.tau`, its original files, converted as timm's `checkpoint_filter_fn`: logit scale = ln(1 /
tau)); its weights show the sizes, heads, head and extra norms (`norm3`), not the image size,
which with `window_ratio` sets its windows: `arch=` or `img_size` gives it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig, channel_stats
from ...model import SwinConfig, SwinCrConfig, SwinTransformer, build_model, get_config
from ...model.swin.window import resize_rel_pos_bias_table
from ..checkpoint import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    load_into,
    mismatch_report,
    strip_prefix,
)
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_SWIN_KEY = re.compile(
    r"^(module\.)?layers\.\d+\.blocks\.\d+\.attn\.(relative_position_bias_table|logit_scale)$"
)
# timm's V2-cr (`swin_transformer_v2_cr.py`): `stages`, a meta network; `tau` in old files.
_CR_KEY = re.compile(r"^(module\.)?stages\.\d+\.blocks\.\d+\.attn\.(meta_mlp\.fc1\.weight|tau)$")
_BUFFERS = ("relative_position_index", "relative_coords_table", "attn_mask",
            "relative_coordinates_log")  # fmt: skip
_BLOCK = re.compile(r"^(?:layers|stages)\.(\d+)\.blocks\.(\d+)\.")
_HEAD_KEYS = ("head.fc.weight", "head.fc.bias")


def is_swin_state_dict(keys: Mapping[str, Any] | list[str]) -> bool:
    """Whether the keys are a Swin Transformer's (V1, V2 or V2-cr), not a ViT's."""
    return any(_SWIN_KEY.match(key) or _CR_KEY.match(key) for key in keys)


def is_cr_state_dict(keys: Mapping[str, Any] | list[str]) -> bool:
    """Whether the keys are timm's Swin V2-cr's (`stages.N.blocks.M.attn.meta_mlp`)."""
    return any(_CR_KEY.match(key) for key in keys)


def timm_swin_layout(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """timm's keys: no DDP `module.` prefix, no buffers, and the original Microsoft layout
    (patch merging at the end of a stage, `head.weight`) moved as timm's
    `checkpoint_filter_fn` does (merging at the start of the next stage, `head.fc`)."""
    sd = strip_prefix(state_dict, "module.")
    original = "layers.0.downsample.reduction.weight" in sd
    cr_original = is_cr_state_dict(sd) and "head.fc.weight" not in sd
    out = {}
    for key, value in sd.items():
        if any(name in key for name in _BUFFERS):
            continue
        if cr_original:  # timm's cr `checkpoint_filter_fn`: tau -> log(1 / tau), head.fc
            if key.endswith("attn.tau"):
                key, value = key[: -len("tau")] + "logit_scale", torch.log(1 / value)
            key = key.replace("head.", "head.fc.")
        elif original:
            key = re.sub(
                r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) + 1}.downsample", key
            )
            key = key.replace("head.", "head.fc.")
        out[key] = value
    return out


def _depths(sd: Mapping[str, Tensor]) -> tuple[int, ...]:
    """The blocks of each stage (`layers.N.blocks.M.` or cr's `stages.N.blocks.M.` keys)."""
    blocks: dict[int, int] = {}
    for key in sd:
        match = _BLOCK.match(key)
        if match:
            stage, block = int(match[1]), int(match[2])
            blocks[stage] = max(blocks.get(stage, 0), block + 1)
    return tuple(blocks[i] for i in range(len(blocks)))


def shown_options(sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """What the tensors show: version, sizes, heads per stage, head size, and (V1) the window
    of each stage's first block."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    depths = _depths(sd)
    stages = range(len(depths))
    version = 2 if "layers.0.blocks.0.attn.logit_scale" in sd else 1
    if version == 2:
        heads = [sd[f"layers.{i}.blocks.0.attn.logit_scale"].shape[0] for i in stages]
    else:
        heads = [
            sd[f"layers.{i}.blocks.0.attn.relative_position_bias_table"].shape[1] for i in stages
        ]
    hidden = sd["layers.0.blocks.0.mlp.fc1.weight"].shape[0]
    shown = {
        "version": version,
        "embed_dim": proj.shape[0],
        "in_chans": proj.shape[1],
        "patch_size": proj.shape[2],
        "depths": depths,
        "num_heads": tuple(heads),
        "mlp_ratio": hidden / proj.shape[0],
        "num_classes": sd["head.fc.weight"].shape[0] if "head.fc.weight" in sd else 0,
        "qkv_bias": "layers.0.blocks.0.attn.qkv.bias" in sd
        or "layers.0.blocks.0.attn.q_bias" in sd,
    }
    if version == 1:
        shown["window_size"] = tuple(_table_window(sd, i) for i in stages)
    return shown


def shown_cr_options(sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """What a V2-cr's tensors show: sizes, heads per stage (logit scales), head size, and
    where the extra main-branch norms are (`norm3`: their period, or one per stage end)."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    depths = _depths(sd)
    shown = {
        "embed_dim": proj.shape[0],
        "in_chans": proj.shape[1],
        "patch_size": proj.shape[2],
        "depths": depths,
        "num_heads": tuple(
            sd[f"stages.{i}.blocks.0.attn.logit_scale"].shape[0] for i in range(len(depths))
        ),
        "mlp_ratio": sd["stages.0.blocks.0.mlp.fc1.weight"].shape[0] / proj.shape[0],
        "num_classes": sd["head.fc.weight"].shape[0] if "head.fc.weight" in sd else 0,
    }
    return {**shown, **_extra_norms(sd, depths)}


def _extra_norms(sd: Mapping[str, Tensor], depths: tuple[int, ...]) -> dict[str, Any]:
    """The `extra_norm_period` / `extra_norm_stage` that put `norm3` where the weights have
    it (the simplest that does); a CheckpointError where none does."""
    found = {
        (s, b)
        for s, depth in enumerate(depths)
        for b in range(depth)
        if f"stages.{s}.blocks.{b}.norm3.weight" in sd
    }
    for period in range(max(depths) + 1):
        for stage_end in (False, True):
            probe = SwinCrConfig(
                embed_dim=1,
                depths=depths,
                num_heads=(1,) * len(depths),
                extra_norm_period=period,
                extra_norm_stage=stage_end,
            )
            placed = {
                (s, b)
                for s, depth in enumerate(depths)
                for b in range(depth)
                if probe.extra_norm(s, b)
            }
            if placed == found:
                return {"extra_norm_period": period, "extra_norm_stage": stage_end}
    raise CheckpointError(
        f"the extra norms (norm3) of these Swin V2-cr weights, at {sorted(found)}, follow no "
        "period nor stage end; these weights are no timm Swin V2-cr"
    )


def _table_window(sd: Mapping[str, Tensor], stage: int) -> int:
    rows = sd[f"layers.{stage}.blocks.0.attn.relative_position_bias_table"].shape[0]
    side = math.isqrt(rows)
    if side * side != rows or side % 2 == 0:
        raise CheckpointError(
            f"layers.{stage} has a bias table of {rows} rows, not (2w - 1)^2 of a square "
            "window; these weights are no timm Swin"
        )
    return (side + 1) // 2


def from_timm_swin(
    state_dict: Mapping[str, Tensor],
    *,
    arch: str | None = None,
    num_heads: Any = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], SwinConfig]:
    """A timm Swin state dict in timm's layout and its `SwinConfig`: the sizes the tensors
    show, over `arch`'s config (a name of `vitkit.list_models('swin*')`: image size, windows,
    pooling) or the `overrides` (`SwinConfig` fields: `img_size`, and for V2 `window_size`,
    which the weights cannot show). `num_heads` is read from the weights; a given one is
    ignored."""
    sd = timm_swin_layout(state_dict)
    if is_cr_state_dict(sd):
        return sd, _cr_config(sd, arch, overrides)
    shown = shown_options(sd)
    overrides = {k: v for k, v in overrides.items() if k in SwinConfig.__dataclass_fields__}
    if arch is not None:
        config = _arch_config(arch, shown, overrides)
    else:
        missing = ["img_size"] + (["window_size"] if shown["version"] == 2 else [])
        if any(name not in overrides for name in missing):
            what = "the image size" + (" nor their windows" if len(missing) == 2 else "")
            raise MissingOptionError(
                f"Swin V{shown['version']} weights do not record {what}",
                ("arch",),
                tuple(missing),
            )
        config = SwinConfig(**{**shown, **overrides})
    with torch.device("meta"):
        expected = SwinTransformer(config).state_dict()
    load_check(expected, sd)
    return sd, config


def _cr_config(
    sd: Mapping[str, Tensor], arch: str | None, overrides: Mapping[str, Any]
) -> SwinCrConfig:
    """The `SwinCrConfig` of V2-cr weights: what they show over `arch`'s config or the
    `overrides`; the image size (which sets the windows, the grid / window_ratio) they do not
    show, so without `arch` it must be given."""
    shown = shown_cr_options(sd)
    overrides = {k: v for k, v in overrides.items() if k in SwinCrConfig.__dataclass_fields__}
    if arch is not None:
        named = get_config(arch)
        if not isinstance(named, SwinCrConfig):
            raise ArchMismatchError(arch, "timm's Swin V2-cr keys (stages.N...meta_mlp)")
        config = named.replace(**{**shown, **overrides})
    elif "img_size" not in overrides:
        raise MissingOptionError(
            "Swin V2-cr weights do not record the image size", ("arch",), ("img_size",)
        )
    else:
        config = SwinCrConfig(**{**shown, **overrides})
    with torch.device("meta"):
        expected = build_model(config).state_dict()
    load_check(expected, sd)
    return config


def _table_rows_aside(shapes: Mapping[str, Any]) -> dict[str, Any]:
    """Shapes with the V1 bias tables' rows left out: a table of another window is resized
    to the model's (`resize_tables`), as timm's `checkpoint_filter_fn` does."""
    return {
        key: (shape[1:] if key.endswith("relative_position_bias_table") else shape)
        for key, shape in shapes.items()
    }


def resize_tables(state_dict: dict[str, Tensor], model: SwinTransformer) -> dict[str, Tensor]:
    """The V1 bias tables of `state_dict` resized to the model's windows where they differ
    (timm's `resize_rel_pos_bias_table`): weights read at one image or window size, run at
    another."""
    own = model.state_dict()
    for key, table in state_dict.items():
        if key.endswith("relative_position_bias_table") and table.shape != own[key].shape:
            window = model.get_submodule(key.rsplit(".", 1)[0]).window_size
            log.info("resizing %s from %s to the %s window", key, tuple(table.shape), window)
            state_dict[key] = resize_rel_pos_bias_table(table, window)
    return state_dict


def _arch_config(arch: str, shown: Mapping[str, Any], overrides: Mapping[str, Any]) -> SwinConfig:
    """`arch`'s config (image size, windows, pre-training windows, pooling) with the sizes the
    weights show; a name of the other version (or a ViT's) is refused."""
    named = get_config(arch)
    if not isinstance(named, SwinConfig):
        raise ArchMismatchError(arch, "Swin weights, and it is a ViT name; pass a swin* name")
    if isinstance(named, SwinCrConfig):
        raise ArchMismatchError(arch, "timm's Swin V1 / V2 keys (layers.N...), not V2-cr's")
    if named.version != shown["version"]:
        raise ArchMismatchError(
            arch, f"version {shown['version']} ({arch}: version {named.version})"
        )
    sizes = {k: v for k, v in shown.items() if k != "window_size"}  # the name's, unclamped
    return named.replace(**{**sizes, **overrides})


def load_check(expected: Mapping[str, Tensor], sd: Mapping[str, Tensor]) -> None:
    """Every key and shape of a Swin of the inferred config, or one readable CheckpointError."""
    expected_shapes = _table_rows_aside({k: tuple(v.shape) for k, v in expected.items()})
    report = mismatch_report(
        expected_shapes, _table_rows_aside({k: tuple(v.shape) for k, v in sd.items()})
    )
    if report:
        raise CheckpointError(
            f"timm Swin weights do not match the inferred model ({report}); pass the "
            "arch= they were made for"
        )


def fill_swin(
    weights: SourceWeights,
    model: SwinTransformer | None,
    fitting: Fitting,
    overrides: Mapping[str, Any],
) -> SwinTransformer:
    """`load_pretrained` for Swin weights: the model (given, or built from the weights' config
    with `overrides` and the fitting's `img_size` and `num_classes`) holding them, a head of
    another size left freshly initialised; eval mode, with the data config."""
    num_classes, img_size = fitting.num_classes, fitting.img_size
    source: SwinConfig = weights.config
    if model is None:
        target = source.replace(**overrides)
        if img_size is not None:
            target = target.replace(img_size=img_size)
        if num_classes is not None:
            target = target.replace(num_classes=num_classes)
        model = build_model(target)
    elif num_classes is not None and num_classes != model.num_classes:
        model.reset_classifier(num_classes)
    state_dict = dict(weights.state_dict)
    if model.num_classes != source.num_classes:
        log.info(
            "new %d-class head (the checkpoint has %d): fine-tune it",
            model.num_classes,
            source.num_classes,
        )
        own = model.state_dict()
        for key in _HEAD_KEYS:
            state_dict.pop(key, None)
            if key in own:
                state_dict[key] = own[key]
    load_into(model, resize_tables(state_dict, model), source=f"{weights.format} Swin checkpoint")
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    data_config = weights.data_config
    if data_config is None:
        log.info(
            "%s states no data config; assuming timm's Swin defaults: ImageNet mean and "
            "std, bicubic, centre crop 0.9",
            weights.name,
        )
        data_config = DataConfig(  # another channel count: the adapted weights' statistics
            input_size=(chans, height, width),
            mean=channel_stats(IMAGENET_MEAN, chans),
            std=channel_stats(IMAGENET_STD, chans),
            interpolation="bicubic",
            crop_pct=0.9,
        )
    model.data_config = data_config.replace(input_size=(chans, height, width))
    return model.eval()
