"""Swin Transformer weights out: a Hugging Face folder (`SwinForImageClassification` /
`Swinv2ForImageClassification`, or their `*Model` without a head) and a timm Hub-style folder
(`swin_*` / `swinv2_*` architectures), each with the model's data config as that library's
preprocessing (as the ViT's, `weights/vit/folders.py`).

The Hugging Face keys are the Hub file names `hf.py` reads (the inverse mapping: `qkv`
split into query / key / value, timm's merging at the start of stage N + 1 moved to the end of
stage N); what Hugging Face's Swin cannot express is refused before anything is written:
another pooling, a norm epsilon other than 1e-5 (its embedding and merging norms are fixed at
it), windows per stage, and image sizes at which its windows differ from timm's
(`hf.check_same_windows`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save as serialize_safetensors
from torch import Tensor

from ...data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from ...files import atomic_write
from ...model import SwinConfig, SwinTransformer
from ...model.layers.patch_embed import to_2tuple
from ...model.swin.cr_config import SwinCrConfig
from ..hub import HF_ACTIVATIONS, class_names, write_hf_folder, write_json
from .hf import check_same_windows

# timm block module -> the HF Hub file name under `encoder.layers.N.blocks.M.`
_HF_BLOCK = {
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
    "attn.proj": "attention.output.dense",
    "attn.cpb_mlp.0": "attention.self.continuous_position_bias_mlp.0",
    "attn.cpb_mlp.2": "attention.self.continuous_position_bias_mlp.2",
    "attn": "attention.self",  # relative_position_bias_table, logit_scale
}
_HF_TOP = {
    "patch_embed.proj": "embeddings.patch_embeddings.projection",
    "patch_embed.norm": "embeddings.norm",
    "norm": "layernorm",
}
_HF_ACTIVATION = {ours: theirs for theirs, ours in reversed(list(HF_ACTIVATIONS.items()))}


def to_hf_swin_config(config: SwinConfig) -> dict[str, Any]:
    """The Hugging Face `SwinConfig` / `Swinv2Config` fields (`config.json`) of the same
    model; a ValueError names what Hugging Face's Swin cannot express."""
    if isinstance(config, SwinCrConfig):
        raise ValueError("Hugging Face has no Swin V2-cr (timm's own layout); use --format timm")
    problems = []
    if config.global_pool != "avg":
        problems.append(f"global_pool={config.global_pool!r} (HF averages)")
    if config.norm_eps != 1e-5:
        problems.append(f"norm_eps={config.norm_eps:g} (HF's embedding and merging norms: 1e-5)")
    if len(set(config.windows)) > 1:
        problems.append(f"windows per stage {config.windows} (HF: one window_size)")
    if config.always_partition:
        problems.append("always_partition=True")
    if config.act_layer not in _HF_ACTIVATION:
        problems.append(f"act_layer={config.act_layer!r}")
    if problems:
        raise ValueError(f"Hugging Face's Swin cannot express {', '.join(problems)}")
    check_same_windows(  # a CheckpointError: ValueError
        config,
        f"Hugging Face V{config.version}",
        fix="export a timm folder (--format timm), whose Swin computes these windows",
    )
    size = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    out = {
        "model_type": "swin" if config.version == 1 else "swinv2",
        "image_size": size,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "embed_dim": config.embed_dim,
        "depths": list(config.depths),
        "num_heads": list(config.num_heads),
        "window_size": config.windows[0],
        "mlp_ratio": config.mlp_ratio,
        "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": config.proj_drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "hidden_act": _HF_ACTIVATION[config.act_layer],
        "use_absolute_embeddings": False,
        "layer_norm_eps": config.norm_eps,
        "encoder_stride": config.patch_size * 2 ** (config.num_stages - 1),
        "num_labels": config.num_classes,
    }
    if config.version == 2:
        out["pretrained_window_sizes"] = list(config.pretrained_windows)
    return out


def to_hf_swin(model: SwinTransformer) -> dict[str, Tensor]:
    """The model's weights under Hugging Face's Hub file names (`swin.` / `swinv2.` prefixed
    with a head, as `*ForImageClassification`; unprefixed without, as `*Model`)."""
    config = model.config
    prefix = ("swin." if config.version == 1 else "swinv2.") if config.num_classes else ""
    out: dict[str, Tensor] = {}
    for key, value in model.state_dict().items():
        value = value.detach().contiguous().cpu()
        block = re.fullmatch(r"layers\.(\d+)\.blocks\.(\d+)\.(.+)\.(\w+)", key)
        merge = re.fullmatch(r"layers\.(\d+)\.downsample\.(\w+)\.(\w+)", key)
        if key.startswith("head.fc."):
            out["classifier." + key.rsplit(".", 1)[1]] = value
        elif merge:
            out[f"{prefix}encoder.layers.{int(merge[1]) - 1}.downsample.{merge[2]}.{merge[3]}"] = (
                value
            )
        elif block:
            pre = f"{prefix}encoder.layers.{block[1]}.blocks.{block[2]}."
            out.update(_hf_block(pre, block[3], block[4], value))
        else:
            module, leaf = key.rsplit(".", 1)
            out[f"{prefix}{_HF_TOP[module]}.{leaf}"] = value
    return out


def _hf_block(pre: str, module: str, leaf: str, value: Tensor) -> dict[str, Tensor]:
    """One block tensor under HF's names: `qkv` split in three, V2's q / v biases apart."""
    self_attn = pre + "attention.self."
    if module == "attn.qkv":
        q, k, v = value.chunk(3)
        out = {f"{self_attn}query.{leaf}": q, f"{self_attn}value.{leaf}": v}
        return {**out, f"{self_attn}key.{leaf}": k}
    if module == "attn" and leaf in ("q_bias", "v_bias"):
        return {f"{self_attn}{'query' if leaf == 'q_bias' else 'value'}.bias": value}
    return {f"{pre}{_HF_BLOCK[module]}.{leaf}": value}


def save_hf_swin_folder(model: SwinTransformer, folder: str | os.PathLike) -> Path:
    """`config.json`, `model.safetensors` and `preprocessor_config.json` that transformers
    loads as the same model (`AutoModelForImageClassification.from_pretrained`)."""
    folder = Path(folder)
    config = to_hf_swin_config(model.config)  # refuses before anything is written
    head = model.config.num_classes > 0
    stem = "Swin" if model.config.version == 1 else "Swinv2"
    config["architectures"] = [f"{stem}ForImageClassification" if head else f"{stem}Model"]
    return write_hf_folder(folder, model, config, to_hf_swin(model), swin_data_config(model))


def timm_swin_args(config: SwinConfig) -> tuple[str, dict[str, Any]]:
    """The timm `architecture` and JSON `model_args` that build `config` (`swin_*` or
    `swinv2_*`; every size given, so the architecture contributes its class only)."""
    if config.norm_eps != 1e-5:
        raise ValueError(f"timm's Swin norms have eps 1e-5; this model has {config.norm_eps:g}")
    if config.windows_like != "timm":
        library = "torchvision" if config.windows_like == "torchvision" else "Hugging Face V"
        check_same_windows(  # a CheckpointError: ValueError
            config.replace(windows_like="timm"),
            library + (str(config.version) if library.endswith("V") else ""),
            fix="timm's Swin windows them otherwise: no faithful timm folder",
        )
    sides = to_2tuple(config.img_size, "img_size")
    if config.dynamic_img_pad and any(side % config.patch_size for side in sides):
        raise ValueError(
            f"timm's Swin does not pad img_size {config.img_size} to whole patches of "
            f"{config.patch_size}: no faithful timm folder"
        )
    windows = config.windows
    if len(set(windows)) > 1 and config.num_stages == 2:
        raise ValueError("timm reads two windows as (height, width), not one per stage")
    args: dict[str, Any] = {
        "img_size": config.img_size if isinstance(config.img_size, int) else list(config.img_size),
        "patch_size": config.patch_size,
        "in_chans": config.in_chans,
        "embed_dim": config.embed_dim,
        "depths": list(config.depths),
        "num_heads": list(config.num_heads),
        "window_size": windows[0] if len(set(windows)) == 1 else list(windows),
        "mlp_ratio": config.mlp_ratio,
        "qkv_bias": config.qkv_bias,
        "always_partition": config.always_partition,
        "strict_img_size": not config.dynamic_img_size,
        "dynamic_img_size": config.dynamic_img_size,
        "drop_path_rate": config.drop_path_rate,
    }
    if isinstance(config, SwinCrConfig):
        del args["qkv_bias"]  # cr always has one bias for q, k and v
        return "swinv2_cr_tiny_224", {**args, **_cr_args(config)}
    if config.version == 2:
        args["act_layer"] = config.act_layer
        args["pretrained_window_sizes"] = list(config.pretrained_windows)
        return "swinv2_tiny_window8_256", args
    if config.act_layer != "gelu":
        raise ValueError(f"timm's Swin V1 has GELU only; this model has {config.act_layer!r}")
    return "swin_tiny_patch4_window7_224", args


def _cr_args(config: SwinCrConfig) -> dict[str, Any]:
    """timm's `SwinTransformerV2Cr` arguments beyond the Swin's: windows from the grid (None)
    or given, the extra norms, the res-post-norm scale."""
    if config.act_layer != "gelu":
        raise ValueError(f"timm's Swin V2-cr has GELU only; this model has {config.act_layer!r}")
    given = config.window_size not in (0, (0,))
    window = config.window_size if isinstance(config.window_size, int) else list(config.window_size)
    ratio = (
        config.window_ratio if isinstance(config.window_ratio, int) else list(config.window_ratio)
    )
    return {
        "window_size": window if given else None,
        "window_ratio": ratio,
        "extra_norm_period": config.extra_norm_period,
        "extra_norm_stage": config.extra_norm_stage,
        "init_values": config.init_values,
    }


def save_timm_swin_folder(model: SwinTransformer, folder: str | os.PathLike) -> Path:
    """`config.json` (architecture, model_args, pretrained_cfg) and `model.safetensors` that
    `timm.create_model("local-dir:" + folder, pretrained=True)` loads as the same model."""
    folder = Path(folder)
    architecture, model_args = timm_swin_args(model.config)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    pretrained_cfg = {
        **swin_data_config(model).to_dict(),
        "num_classes": model.config.num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": "head.fc",
        "fixed_input_size": not model.config.dynamic_img_size,
        "label_names": class_names(model),
    }
    config = {
        "architecture": architecture,
        "num_classes": model.config.num_classes,
        "num_features": model.config.num_features,
        "global_pool": model.config.global_pool if model.config.global_pool != "none" else "",
        "model_args": model_args,
        "pretrained_cfg": pretrained_cfg,
    }
    write_json(folder / "config.json", config)
    data = serialize_safetensors(tensors, metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    return folder


def swin_data_config(model: SwinTransformer) -> DataConfig:
    """The model's data config, or timm's Swin default (ImageNet statistics, bicubic, 0.9)."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    imagenet = chans == 3
    return DataConfig(
        input_size=(chans, height, width),
        interpolation="bicubic",
        crop_pct=0.9,
        mean=IMAGENET_MEAN if imagenet else 0.5,
        std=IMAGENET_STD if imagenet else 0.5,
    )


def swin_folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The `SwinConfig` options of a timm Swin folder's `model_args` (as `timm_swin_args`
    writes them): what the weights do not show (image size, windows, pre-training windows)."""
    fields = SwinCrConfig.__dataclass_fields__  # a superset of SwinConfig's
    options = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in model_args.items()
        if key in fields and value is not None  # None: cr's windows from the grid
    }
    if model_args.get("strict_img_size") is False:
        options["dynamic_img_size"] = True
    return options
