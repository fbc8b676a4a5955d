"""Swin Transformer weights from torchvision (`models/swin_transformer.py`: `swin_t` / `_s` /
`_b` and `swin_v2_t` / `_s` / `_b`, or its `SwinTransformer` class built with other sizes).

torchvision's `features` interleave the stages and the patch merging between them
(`features.0` the patch embedding, `features.1` stage 0, `features.2` a merging, ...): the
merging at index 2i goes to the start of timm's stage i, the blocks at 2i + 1 to stage i, the
MLP's `mlp.0` / `mlp.3` to `fc1` / `fc2`. The V1 bias tables and the saved
`relative_position_index` (V2: `relative_coords_table`) buffers show each stage's window. A V2
`qkv.bias` holds a k bias that torchvision zeroes at every forward: it is dropped, and the q
and v thirds become timm's `q_bias` / `v_bias`.

The weights do not record the image size: `arch=` or `img_size` gives it. torchvision pads a
map to whole windows and attends to the padding, where timm clamps a window to a smaller map
and shifts before padding: an image size whose stage maps are not whole windows is refused
(`swin_hf.check_same_windows`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..model import SwinConfig
from .checkpoint import CheckpointError
from .swin import from_timm_swin
from .swin_hf import check_same_windows, coords_windows, require_img_size
from .torchvision import from_torchvision

_BLOCK_NAMES = {"mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2"}


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
        top = {"features.0.0": "patch_embed.proj", "features.0.2": "patch_embed.norm",
               "norm": "norm", "head": "head.fc"}  # fmt: skip
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
    windows the tensors show, the image size from `arch` (a `swin*` name) or the `overrides`
    (`SwinConfig` fields; `fit_img_size` is `load_pretrained`'s img_size)."""
    fit_img_size = overrides.pop("fit_img_size", None)
    overrides.pop("num_heads", None)  # read from the weights
    sd = torchvision_to_timm_swin(state_dict)
    windows = coords_windows(sd)
    if windows is None:
        windows = _index_windows(state_dict)
    options: dict[str, Any] = {"norm_eps": 1e-5, "pretrained_window_sizes": 0}
    if windows is not None:
        options["window_size"] = windows
    options.update(overrides)
    if fit_img_size is not None and arch is None:
        options.setdefault("img_size", fit_img_size)
    require_img_size(options, arch, "torchvision")
    sd, config = from_timm_swin(sd, arch=arch, **options)
    if windows is not None and config.version == 2:
        config = config.replace(window_size=windows, pretrained_window_sizes=0)
    check_same_windows(config, "torchvision")
    return sd, config


def _index_windows(state_dict: Mapping[str, Tensor]) -> tuple[int, ...] | None:
    """Each stage's window from its saved `relative_position_index` ((w^2)^2 entries)."""
    windows = {}
    for key, value in state_dict.items():
        match = re.fullmatch(r"features\.(\d+)\.0\.attn\.relative_position_index", key)
        if match:
            windows[(int(match[1]) - 1) // 2] = math.isqrt(math.isqrt(value.shape[0]))
    return tuple(windows[i] for i in sorted(windows)) if windows else None


def from_torchvision_or_swin(
    state_dict: Mapping[str, Tensor], **options: Any
) -> tuple[dict[str, Tensor], Any]:
    """The 'torchvision' converter: `from_torchvision_swin` for Swin keys, else the ViT's."""
    if is_torchvision_swin(list(state_dict)):
        return from_torchvision_swin(state_dict, **options)
    options.pop("fit_img_size", None)
    return from_torchvision(state_dict, **options)
