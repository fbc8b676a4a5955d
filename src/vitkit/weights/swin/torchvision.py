"""Swin Transformer weights from torchvision (`models/swin_transformer.py`: `swin_t` / `_s` /
`_b` and `swin_v2_t` / `_s` / `_b`, or its `SwinTransformer` class built with other sizes).

torchvision's `features` interleave the stages and the patch merging between them
(`features.0` the patch embedding, `features.1` stage 0, `features.2` a merging, ...): the
merging at index 2i goes to the start of timm's stage i, the blocks at 2i + 1 to stage i, the
MLP's `mlp.0` / `mlp.3` to `fc1` / `fc2`. The V1 bias tables and the saved
`relative_position_index` (V2: `relative_coords_table`) buffers show each stage's window. A V2
`qkv.bias` holds a k bias that torchvision zeroes at every forward: it is dropped, and the q
and v thirds become timm's `q_bias` / `v_bias`.

The weights do not record the image size: `arch=` or `img_size` gives it, or the builder the
tensors' sizes name (`swin_t` ...), read as torchvision's model (its eval size, any input size,
`windows_like='torchvision'`, the data config of its weights' transforms). torchvision pads a
map to whole windows before the shift and attends to the padding, where timm clamps a window
to a smaller map and shifts before padding: under timm's windowing an image size whose stage
maps are not whole windows is refused (`hf.check_same_windows`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from ...model import SwinConfig
from ...model.layers.patch_embed import to_2tuple
from ..checkpoint import ArchMismatchError, CheckpointError, MissingOptionError
from .hf import check_same_windows, coords_windows, read_renamed
from .timm import from_timm_swin

_BLOCK_NAMES = {"mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2"}

# torchvision's Swin builders: (version, embed_dim, depths, heads, window, the crop and the
# resize of their weights' eval transform), `models/swin_transformer.py` and
# `Swin_*_Weights.IMAGENET1K_V1.transforms` (bicubic, ImageNet statistics).
TORCHVISION_SWIN: dict[str, tuple[int, int, tuple[int, ...], tuple[int, ...], int, int, int]] = {
    "swin_t": (1, 96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 224, 232),
    "swin_s": (1, 96, (2, 2, 18, 2), (3, 6, 12, 24), 7, 224, 246),
    "swin_b": (1, 128, (2, 2, 18, 2), (4, 8, 16, 32), 7, 224, 238),
    "swin_v2_t": (2, 96, (2, 2, 6, 2), (3, 6, 12, 24), 8, 256, 260),
    "swin_v2_s": (2, 96, (2, 2, 18, 2), (3, 6, 12, 24), 8, 256, 260),
    "swin_v2_b": (2, 128, (2, 2, 18, 2), (4, 8, 16, 32), 8, 256, 272),
}  # fmt: skip


def is_torchvision_swin(keys: Mapping[str, Any] | list[str]) -> bool:
    """Whether the keys are a torchvision Swin's (`features.1.0.attn...`)."""
    return any(key.startswith("features.1.0.attn.") for key in keys)


def torchvision_to_timm_swin(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """torchvision Swin keys renamed to timm's (the saved index buffers read for the windows
    and dropped); a key no rule maps is refused in one line."""
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in state_dict.items():
        match = re.fullmatch(r"features\.(\d+)\.(.+)", key)
        top = {
            "features.0.0": "patch_embed.proj",
            "features.0.2": "patch_embed.norm",
            "norm": "norm",
            "head": "head.fc",
        }
        stem, _, leaf = key.rpartition(".")
        if stem in top:
            out[f"{top[stem]}.{leaf}"] = value
        elif match and int(match[1]) % 2 == 0 and match[2].startswith(("reduction.", "norm.")):
            out[f"layers.{int(match[1]) // 2}.downsample.{match[2]}"] = value
        elif match and (block := re.fullmatch(r"(\d+)\.(.+)", match[2])):
            stage, name = (int(match[1]) - 1) // 2, block[2]
            if name == "attn.relative_position_index":  # read by `_index_windows`
                continue
            head, _, leaf = name.rpartition(".")
            name = f"{_BLOCK_NAMES.get(head, head)}.{leaf}"
            out[f"layers.{stage}.blocks.{block[1]}.{name}"] = value
        else:
            unknown.append(key)
    if unknown:
        raise CheckpointError(
            f"torchvision Swin weights not understood: {', '.join(sorted(unknown)[:5])}; "
            "expected swin_t/s/b or swin_v2_t/s/b keys"
        )
    for key in [k for k in out if k.endswith("attn.logit_scale")]:  # V2: q and v biases only
        attn = key[: -len("logit_scale")]
        if attn + "qkv.bias" in out:
            q, _, v = out.pop(attn + "qkv.bias").chunk(3)
            out[attn + "q_bias"], out[attn + "v_bias"] = q, v
    return out


def from_torchvision_swin(
    state_dict: Mapping[str, Tensor], *, arch: str | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], SwinConfig]:
    """A torchvision Swin state dict in timm's layout and its `SwinConfig`: the sizes and
    windows the tensors show, the image size from `arch` (a vitkit `swin*` name), the
    `overrides` (`SwinConfig` fields; `fit_img_size` is `load_pretrained`'s img_size), or a
    torchvision builder: named (`arch='swin_t'`) or, without a name or a size, the one whose
    sizes the tensors show. A builder's weights read as torchvision's model: its eval size,
    any input size (`dynamic_img_size`) windowed as torchvision does (`windows_like`)."""
    fit_img_size = overrides.pop("fit_img_size", None)
    overrides.pop("num_heads", None)  # read from the weights
    sd = torchvision_to_timm_swin(state_dict)
    windows = coords_windows(sd)
    if windows is None:
        windows = _index_windows(state_dict)
    options: dict[str, Any] = {"norm_eps": 1e-5, "pretrained_window_sizes": 0}
    if windows is not None:
        options["window_size"] = windows
    builder = None
    if arch in TORCHVISION_SWIN:
        builder, arch = arch, None
    elif arch is None and fit_img_size is None and "img_size" not in overrides:
        builder = _builder_of(sd, options)
    if builder is not None:
        options.update(img_size=TORCHVISION_SWIN[builder][5], dynamic_img_size=True)
        options["windows_like"] = "torchvision"
    options.update(overrides)
    sd, config = read_renamed(
        sd, options, arch=arch, fit_img_size=fit_img_size, library="torchvision"
    )
    if builder is not None and torchvision_swin_builder(config) != builder:
        raise ArchMismatchError(
            builder,
            f"version {config.version}, width {config.embed_dim}, depths {config.depths}, heads "
            f"{config.num_heads}, windows {config.windows}",
        )
    check_same_windows(config, "torchvision")
    return sd, config


def _builder_of(sd: dict[str, Tensor], options: dict[str, Any]) -> str:
    """The torchvision builder whose sizes the weights show; without one, a one-line refusal
    asking for what they do not record (the image size)."""
    _, config = from_timm_swin(dict(sd), **options, img_size=224)
    builder = torchvision_swin_builder(config)
    if builder is None:
        raise MissingOptionError(
            "torchvision Swin weights of sizes no builder (swin_t ... swin_v2_b) has do not "
            "record the image size",
            ("arch",),
            ("img_size",),
        )
    return builder


def torchvision_data_config(config: SwinConfig) -> DataConfig | None:
    """The eval transform of a torchvision builder's weights (`Swin_T_Weights.IMAGENET1K_V1
    .transforms()`: bicubic resize of the shorter side to 232, centre crop 224, ImageNet
    statistics), at `config`'s image size; None for sizes of no builder."""
    builder = torchvision_swin_builder(config)
    if builder is None:
        return None
    *_, crop, resize = TORCHVISION_SWIN[builder]
    height, width = to_2tuple(config.img_size, "img_size")
    return DataConfig(
        input_size=(config.in_chans, height, width),
        interpolation="bicubic",
        crop_pct=crop / resize,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


def torchvision_swin_builder(config: SwinConfig) -> str | None:
    """The torchvision builder of `config`'s version, sizes and windows; None for others."""
    sizes = (config.version, config.embed_dim, config.depths, config.num_heads)
    for name, (*named, window, _, _) in TORCHVISION_SWIN.items():
        if sizes == tuple(named) and set(config.windows) == {window} and config.patch_size == 4:
            return name
    return None


def torchvision_swin_model(config: SwinConfig) -> Any:
    """torchvision's `SwinTransformer` of the same architecture (the parity reference)."""
    from torchvision.models import swin_transformer as tv

    extra = {}
    if config.version == 2:
        extra = {"block": tv.SwinTransformerBlockV2, "downsample_layer": tv.PatchMergingV2}
    windows = set(config.windows)
    if len(windows) > 1:
        raise ValueError("torchvision's SwinTransformer has one window for every stage")
    window = windows.pop()
    return tv.SwinTransformer(
        patch_size=[config.patch_size] * 2,
        embed_dim=config.embed_dim,
        depths=list(config.depths),
        num_heads=list(config.num_heads),
        window_size=[window, window],
        mlp_ratio=config.mlp_ratio,
        num_classes=config.num_classes,
        **extra,
    )


def _index_windows(state_dict: Mapping[str, Tensor]) -> tuple[int, ...] | None:
    """Each stage's window from its saved `relative_position_index` ((w^2)^2 entries)."""
    windows = {}
    for key, value in state_dict.items():
        match = re.fullmatch(r"features\.(\d+)\.0\.attn\.relative_position_index", key)
        if match:
            windows[(int(match[1]) - 1) // 2] = math.isqrt(math.isqrt(value.shape[0]))
    return tuple(windows[i] for i in sorted(windows)) if windows else None
