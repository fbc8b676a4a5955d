"""Swin Transformer weights from Hugging Face transformers (`models/swin`: `SwinModel`,
`SwinForImageClassification`; `models/swinv2`: `Swinv2Model`, `Swinv2ForImageClassification`).

The keys are renamed to timm's (`timm.py` then reads them): q, k and v fused into one `qkv`
(V2: the q and v biases apart, k has none), the patch merging of the end of stage N moved to
the start of stage N + 1 (as timm's `checkpoint_filter_fn` does for the original layout), the
classifier to `head.fc`. Two key layouts are read: the Hub file layout (`attention.self.query`,
`intermediate.dense`) and transformers 5's module layout of V1 (`attention.q_proj`,
`attention.relative_position_bias.relative_position_bias_table`, `mlp.fc1`). The folder's
`config.json` gives what the tensors do not show: the image size, the V2 windows and
pre-training windows, `layer_norm_eps` and `hidden_act`.

HF pads a feature map to whole windows before it shifts it, timm (and vitkit) shift, then pad;
HF's V1 clamps a window to the smaller side of a map, timm each side to that side. Both agree
wherever a shifted stage's map is whole windows or padded by exactly the shift (and, for V1,
no map is smaller than the window): `check_same_windows` refuses the other image sizes in one
line, unless the model windows as HF does (`windows_like='hf'`; `dynamic_img_pad` for an image
of partial patches, which HF pads). A `SwinBackbone` / `Swinv2Backbone` folder is read by
`hf_backbone.py`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...model import SwinConfig
from ...model.layers.patch_embed import to_2tuple
from ..checkpoint import CheckpointError, MissingOptionError
from ..hub import HF_ACTIVATIONS, hf_config_dict, unknown_weights_error
from .timm import from_timm_swin

log = logging.getLogger(__name__)

_MODELS = "SwinModel / SwinForImageClassification / Swinv2Model / Swinv2ForImageClassification"
_PREFIXES = ("swinv2.", "swin.")

# (regex of a block module, timm's module) under `encoder.layers.N.blocks.M.`; q, k and v go
# to `attn.q` / `attn.k` / `attn.v`, fused afterwards.
_BLOCK_RULES = (
    (r"layernorm_before", "norm1"),
    (r"layernorm_after", "norm2"),
    (r"intermediate\.dense|mlp\.fc1", "mlp.fc1"),
    (r"output\.dense|mlp\.fc2", "mlp.fc2"),
    (r"attention\.output\.dense|attention\.o_proj", "attn.proj"),
    (r"attention\.self\.query|attention\.q_proj", "attn.q"),
    (r"attention\.self\.key|attention\.k_proj", "attn.k"),
    (r"attention\.self\.value|attention\.v_proj", "attn.v"),
    (r"attention\.self\.continuous_position_bias_mlp\.0", "attn.cpb_mlp.0"),
    (r"attention\.self\.continuous_position_bias_mlp\.2", "attn.cpb_mlp.2"),
    (r"attention\.(?:self|relative_position_bias)", "attn"),  # tables, V2's logit scale
)
_LEAVES = r"weight|bias|relative_position_bias_table|logit_scale|relative_coords_table"
# (regex on the unprefixed key, timm key)
_RULES = (
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.norm\.(weight|bias)", r"patch_embed.norm.\1"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (r"classifier\.(weight|bias)", r"head.fc.\1"),
    *(
        (rf"encoder\.layers\.(\d+)\.blocks\.(\d+)\.(?:{module})\.({_LEAVES})",
         rf"layers.\1.blocks.\2.{timm}.\3")
        for module, timm in _BLOCK_RULES
    ),
    (r"encoder\.layers\.(\d+)\.downsample\.(reduction|norm)\.(weight|bias)",
     lambda m: f"layers.{int(m[1]) + 1}.downsample.{m[2]}.{m[3]}"),
)  # fmt: skip
_DROPPED = re.compile(r".*relative_position_index|embeddings\.mask_token")


def is_hf_swin(keys: Mapping[str, Any] | list[str]) -> bool:
    """Whether Hugging Face keys are a Swin's (V1 or V2), not a ViT family's."""
    return any(".blocks.0.layernorm_before." in key for key in keys)


def hf_to_timm_swin(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """HF Swin keys (either layout, with or without the `swin.` / `swinv2.` prefix) renamed to
    timm's, q / k / v fused; an absolute position embedding (`use_absolute_embeddings`) or a
    key no rule maps is refused in one line."""
    out: dict[str, Tensor] = {}
    unknown = {}
    for key, value in state_dict.items():
        name = next((key[len(p) :] for p in _PREFIXES if key.startswith(p)), key)
        if name.startswith("hidden_states_norms."):
            raise CheckpointError(
                "these are a transformers SwinBackbone's weights (per-stage "
                "hidden_states_norms): read its folder with "
                "vitkit.weights.swin.hf_backbone.load_hf_swin_backbone"
            )
        if name == "embeddings.position_embeddings":
            raise CheckpointError(
                "these Swin weights have an absolute position embedding "
                "(use_absolute_embeddings=True), which timm's and vitkit's Swin do not have"
            )
        if _DROPPED.fullmatch(name):
            continue
        for pattern, target in _RULES:
            new, count = re.subn(f"^{pattern}$", target, name)
            if count:
                out[new] = value
                break
        else:
            unknown[key] = value
    if unknown:
        raise unknown_weights_error(unknown, _MODELS)
    _fuse_qkv(out)
    return out


def _fuse_qkv(sd: dict[str, Tensor]) -> None:
    """`attn.q` / `attn.k` / `attn.v` -> `attn.qkv` (3D rows); V2 (a logit scale) keeps its q
    and v biases apart (`q_bias`, `v_bias`) and has no k bias."""
    for key in [k for k in sd if k.endswith(".attn.q.weight")]:
        attn = key[: -len("q.weight")]
        sd[attn + "qkv.weight"] = torch.cat([sd.pop(f"{attn}{n}.weight") for n in "qkv"])
        if attn + "logit_scale" in sd:
            for name in "qv":
                if f"{attn}{name}.bias" in sd:
                    sd[f"{attn}{name}_bias"] = sd.pop(f"{attn}{name}.bias")
            sd.pop(f"{attn}k.bias", None)
        elif attn + "q.bias" in sd:
            sd[attn + "qkv.bias"] = torch.cat([sd.pop(f"{attn}{n}.bias") for n in "qkv"])


def coords_windows(sd: dict[str, Tensor]) -> tuple[int, ...] | None:
    """The V2 window of each stage from the saved `relative_coords_table` buffers
    ((1, 2w - 1, 2w - 1, 2)), which are removed; None when the weights have none."""
    tables = {k: sd.pop(k) for k in [k for k in sd if k.endswith("relative_coords_table")]}
    windows: dict[int, int] = {}
    for key, table in tables.items():
        stage = int(key.split(".")[1])
        if table.shape[1] != table.shape[2]:
            raise CheckpointError(
                f"{key} is of a {tuple(table.shape[1:3])} window, not a square "
                "one; vitkit's Swin has square windows"
            )
        windows.setdefault(stage, (table.shape[1] + 1) // 2)
    return tuple(windows[i] for i in sorted(windows)) if windows else None


def from_hf_swin(
    state_dict: Mapping[str, Tensor],
    *,
    config: Any = None,
    arch: str | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], SwinConfig]:
    """A Hugging Face Swin / Swinv2 state dict in timm's layout and its `SwinConfig`.

    Args:
        state_dict: the weights, Hub file or transformers 5 module layout.
        config: the `config.json` (path, dict or transformers config): image size, windows,
            V2 pre-training windows, `layer_norm_eps`, `hidden_act`.
        arch: a `swin*` name for what a state dict without its config does not show.
        overrides: `SwinConfig` fields (e.g. `img_size`, `window_size`); `fit_img_size` is
            `load_pretrained`'s img_size, used where nothing else gives the image size.
    """
    hf = hf_config_dict(config)
    fit_img_size = overrides.pop("fit_img_size", None)
    overrides.pop("num_heads", None)  # read from the weights
    if {"SwinBackbone", "Swinv2Backbone"} & set(hf.get("architectures") or ()):
        raise CheckpointError(
            f"the config is of a transformers {hf['architectures'][0]}; read its folder "
            "with vitkit.weights.swin.hf_backbone.load_hf_swin_backbone"
        )
    sd = hf_to_timm_swin(state_dict)
    options: dict[str, Any] = {}
    if hf:
        if hf.get("use_absolute_embeddings"):
            raise CheckpointError(
                "the config has use_absolute_embeddings=True, which timm's "
                "and vitkit's Swin do not have"
            )
        size = hf.get("image_size", 224)
        options["img_size"] = size if isinstance(size, int) else tuple(size)
        options["window_size"] = hf.get("window_size", 7)
        if hf.get("layer_norm_eps", 1e-5) != 1e-5:  # HF's embedding / merging norms: 1e-5
            raise CheckpointError(
                f"layer_norm_eps {hf['layer_norm_eps']:g} holds in HF's blocks only (its "
                "embedding and merging norms use 1e-5); vitkit's Swin has one norm_eps"
            )
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise CheckpointError(
                f"hidden_act {act!r} has no vitkit counterpart; expected one "
                f"of {', '.join(HF_ACTIVATIONS)}"
            )
        options["act_layer"] = HF_ACTIVATIONS[act]
        if "pretrained_window_sizes" in hf:  # transformers reads entry i for stage i
            stages = len(hf.get("depths", ())) or None
            options["pretrained_window_sizes"] = tuple(hf["pretrained_window_sizes"][:stages])
    windows = coords_windows(sd)
    if windows is not None and "window_size" not in options:
        options["window_size"] = windows
    options.update(overrides)
    _check_whole_patches(options, sd)
    sd, swin = read_renamed(
        sd, options, arch=arch, fit_img_size=fit_img_size, library="Hugging Face"
    )
    check_same_windows(swin, f"Hugging Face V{swin.version}")
    return sd, swin


def _check_whole_patches(options: Mapping[str, Any], sd: Mapping[str, Tensor]) -> None:
    """Refuse in one line an image size of partial patches, which HF pads (unless the options
    pad it too)."""
    weight = sd.get("patch_embed.proj.weight")
    if "img_size" not in options or weight is None or options.get("dynamic_img_pad"):
        return
    size, patch = options["img_size"], weight.shape[-1]
    if any(side % patch for side in to_2tuple(size, "img_size")):
        raise CheckpointError(
            f"image_size {size} is not a multiple of the patch size {patch}, which Hugging "
            "Face pads to whole patches; pass dynamic_img_pad=True and windows_like='hf' to "
            "do the same"
        )


def read_renamed(
    sd: dict[str, Tensor],
    options: dict[str, Any],
    *,
    arch: str | None,
    fit_img_size: Any,
    library: str,
) -> tuple[dict[str, Tensor], SwinConfig]:
    """`from_timm_swin` of weights renamed to timm's, with `options` (what the source states
    and the caller gives); `fit_img_size` (`load_pretrained`'s img_size) where nothing else
    gives the image size, and a one-line refusal where nothing does."""
    if fit_img_size is not None and arch is None:
        options.setdefault("img_size", fit_img_size)
    if arch is None and "img_size" not in options:
        raise MissingOptionError(
            f"{library} Swin weights do not record the image size", ("arch",), ("img_size",)
        )
    return from_timm_swin(sd, arch=arch, **options)


def _same_windows(library: str, sides: tuple[int, int], window: int, shifted: bool) -> bool:
    """Whether `library`'s windows on a stage map of `sides` compute timm's: it pads a map
    to whole windows before the shift (timm shifts, then pads), which is the same where the
    padding is none or exactly the shift (the padding and the wrapped rows then fall in
    regions of their own either way); torchvision pads a map smaller than its window where
    timm clamps the window; transformers 5's V1 keeps the table of the configured window (its
    own forward fails on a smaller map) and drops the shift on both sides when the smaller
    side fits the window, where timm drops it per side. Measured against both libraries
    (tests/weights/test_swin_hf.py); a map shifted on one side only and padded differs."""
    if library == "torchvision" and min(sides) < window:
        return False
    if library == "Hugging Face V1" and not _v1_clamps_alike(sides, window, shifted):
        return False
    if not shifted or all(side % window == 0 for side in sides):
        return True
    return all(side > window and -side % window in (0, window // 2) for side in sides)


def _v1_clamps_alike(sides: tuple[int, int], window: int, shifted: bool) -> bool:
    """Whether HF V1's clamping (the smaller side for both, no shift, and a forward that
    fails on a map smaller than its window) agrees with timm's per-side clamping."""
    if min(sides) > window:
        return True
    return min(sides) == window and not (shifted and sides[0] != sides[1])


# The `windows_like` of each library's windowing.
_LIKE = {"torchvision": "torchvision", "Hugging Face V1": "hf", "Hugging Face V2": "hf"}


def check_same_windows(config: SwinConfig, library: str, fix: str | None = None) -> None:
    """Refuse, in one line ending with `fix` (default: a size of whole windows, or the
    `windows_like` of `library`), an image size at which `library`'s ('torchvision', 'Hugging
    Face V1' or 'Hugging Face V2') windows differ from `config`'s: timm's (`_same_windows`),
    or the library's own under its `windows_like`, where only HF V1's clamping differs."""
    like = _LIKE[library]
    if fix is None:
        fix = (
            "load at an img_size whose stage maps are whole windows, or pass "
            f"windows_like='{like}' (its windowing)"
        )
    if config.windows_like not in ("timm", like):
        raise CheckpointError(
            f"windows_like={config.windows_like!r} is not {library}'s windowing; pass "
            f"windows_like='{like}' or 'timm'"
        )
    for stage in range(config.num_stages):
        sides, window = config.stage_resolution(stage), config.windows[stage]
        shifted = config.depths[stage] > 1 and max(sides) > window  # odd blocks shift
        if config.windows_like == like:
            same = library != "Hugging Face V1" or config.always_partition  # no clamping
            same = same or _v1_clamps_alike(sides, window, shifted)
        else:
            same = _same_windows(library, sides, window, shifted)
        if not same:
            raise CheckpointError(
                f"at img_size {config.img_size} stage {stage} is a {sides[0]}x{sides[1]} map for "
                f"a window of {window}, which {library} pads or clamps unlike timm: no faithful "
                f"copy; {fix}"
            )
