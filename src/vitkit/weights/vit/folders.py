"""Weights out as the folders other libraries load: a Hugging Face model folder
(`ViTForImageClassification.from_pretrained(dir)`, `AutoImageProcessor.from_pretrained(dir)`)
and a timm Hub-style folder (`timm.create_model("local-dir:" + dir, pretrained=True)`).

Each folder carries the model's data config the way that library reads it, so that it
prepares images pixel for pixel as vitkit does: timm's `pretrained_cfg` in `config.json`, and
for Hugging Face a `preprocessor_config.json` of transformers' `TimmWrapperImageProcessor`
holding the same `pretrained_cfg` (it runs timm's eval transform, which vitkit's reproduces).
Hugging Face's own `ViTImageProcessor` / `CLIPImageProcessor` cannot: their centre crop floors
the offset where timm's (torchvision's `CenterCrop`) rounds it, one pixel apart whenever the
resized side minus the crop is 3 mod 4, and their default torchvision backend resizes unlike
Pillow. Files are written atomically; the folder is created.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save as serialize_safetensors

from ...data.data_config import DataConfig
from ...files import atomic_write
from ...model import VisionTransformer, ViTConfig, get_config, list_models
from ...model.layers.patch_embed import to_2tuple
from ..hub import class_names, write_hf_folder, write_json
from .hf import to_hf, to_hf_config
from .timm import ARCH_FIELDS, timm_kwargs, to_timm

# The timm factory that passes each block / MLP class vitkit's options need (timm
# models/vision_transformer.py, deit.py); '' is the paper's ViT.
_TIMM_ARCHITECTURES = {
    "": "vit_base_patch16_224",
    "distilled=True": "deit_base_distilled_patch16_224",
    "res_post_norm=True": "vit_base_patch16_rpn_224",  # ResPostBlock
    "mlp_layer='swiglu'": "aimv2_large_patch14_224",  # SwiGLU (fc1_g, fc1_x)
    "mlp_layer='swiglu_packed'": "vit_giant_patch14_dinov2",  # SwiGLUPacked (gate first)
}
# timm's defaults of the keywords those factories set, written whenever the model keeps them
# so that the architecture contributes its class and nothing else.
_TIMM_PLAIN_ARGS = {
    "act_layer": "gelu",
    "proj_bias": True,
    "reg_tokens": 0,
    "no_embed_class": False,
    "pre_norm": False,
    "final_norm": True,
    "dynamic_img_pad": False,
    "pool_include_prefix": False,
    "qk_norm": False,
    "scale_attn_norm": False,
    "scale_mlp_norm": False,
}


def save_hf_folder(model: VisionTransformer, folder: str | os.PathLike) -> Path:
    """`config.json`, `model.safetensors` and `preprocessor_config.json` that transformers
    loads as the same model (`ViTForImageClassification`, or `ViTModel` without a head).

    A model Hugging Face's ViT cannot express is refused before anything is written, naming
    the format that can hold it."""
    folder = Path(folder)
    try:  # everything that can refuse the model comes before the first write
        config = to_hf_config(model.config)
        data_config = _data_config(model)
        tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf(model).items()}
    except ValueError as err:
        raise ValueError(f"{err}; {_elsewhere(model, 'hf')}") from None
    head = model.config.num_classes > 0
    config.update(
        model_type="vit", architectures=["ViTForImageClassification" if head else "ViTModel"]
    )
    return write_hf_folder(folder, model, config, tensors, data_config)


def save_timm_folder(model: VisionTransformer, folder: str | os.PathLike) -> Path:
    """`config.json` (architecture, model_args, pretrained_cfg) and `model.safetensors` that
    `timm.create_model("local-dir:" + folder, pretrained=True)` loads as the same model.

    A model timm's config.json cannot express is refused before anything is written, naming
    the format that can hold it."""
    folder = Path(folder)
    try:
        architecture, model_args = timm_folder_args(model.config)
        tensors = {k: v.detach().contiguous().cpu() for k, v in to_timm(model).items()}
    except ValueError as err:
        raise ValueError(f"{err}; {_elsewhere(model, 'timm')}") from None
    data_config = _data_config(model)
    pretrained_cfg = {
        **data_config.to_dict(),
        "num_classes": model.config.num_classes,
        "first_conv": model.config.first_conv,
        "classifier": "head",
        "fixed_input_size": not model.config.dynamic_img_size,
        "label_names": class_names(model),
    }
    config = {
        "architecture": architecture,
        "num_classes": model.config.num_classes,
        "num_features": model.config.embed_dim,
        "global_pool": model.config.global_pool,
        "model_args": model_args,
        "pretrained_cfg": pretrained_cfg,
    }
    write_json(folder / "config.json", config)
    data = serialize_safetensors(tensors, metadata={"format": "pt"})
    atomic_write(folder / "model.safetensors", lambda f: f.write(data))
    return folder


def timm_folder_args(config: ViTConfig) -> tuple[str, dict[str, Any]]:
    """The `architecture` and JSON `model_args` of a timm config.json that build `config`.

    JSON names norms and activations by string (timm's eps 1e-6), but a block or MLP class
    only through the architecture: timm's factory of that name passes it, and `model_args`
    override every other keyword it sets. A ValueError names what no folder can carry."""
    if config.norm_eps != 1e-6:
        raise ValueError(
            f"a timm config.json names norms without their eps (timm's is 1e-6); this model "
            f"has norm_eps={config.norm_eps:g}"
        )
    if config.hybrid != "none":
        architecture = _timm_hybrid_architecture(config)
    else:
        architecture = _timm_plain_architecture(config)
    norm = config.norm_layer  # 'layernorm' / 'rmsnorm': timm's names of the same norms
    kwargs = timm_kwargs(config)
    for name in ("norm_layer", "embed_norm_layer", "mlp_layer", "block_fn", "embed_layer"):
        kwargs.pop(name, None)  # not JSON: named below or given by the architecture
    model_args = {
        **_TIMM_PLAIN_ARGS,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
        "norm_layer": norm,
        "embed_norm_layer": norm if config.embed_norm else None,
    }
    return architecture, model_args


def _timm_plain_architecture(config: ViTConfig) -> str:
    """The timm factory that passes the block / MLP class `config` needs."""
    classes = {  # option set -> the timm architecture whose factory passes its class
        "distilled=True": config.distilled,
        "res_post_norm=True": config.res_post_norm,
        f"mlp_layer={config.mlp_layer!r}": config.mlp_layer != "mlp",
    }
    wanted = [name for name, on in classes.items() if on]
    if len(wanted) > 1:
        raise ValueError(
            f"no timm architecture builds {' with '.join(wanted)} (timm takes each from a "
            "different model factory)"
        )
    if wanted and wanted[0] not in _TIMM_ARCHITECTURES:
        raise ValueError(f"no timm ViT factory builds {wanted[0]}")
    return _TIMM_ARCHITECTURES[wanted[0] if wanted else ""]


def _timm_hybrid_architecture(config: ViTConfig) -> str:
    """timm builds a hybrid's CNN in the factory of its name, never from `model_args`: the
    first timm name with `config`'s CNN (and MLP, and for ViTamin's stem, which projects to
    the width itself, its width)."""
    stem = ("hybrid", "hybrid_layers", "hybrid_widths", "mlp_layer")
    if config.hybrid == "mbconv":
        stem += ("embed_dim",)
    for name in list_models():
        named = get_config(name)
        if isinstance(named, ViTConfig) and all(
            getattr(named, field) == getattr(config, field) for field in stem
        ):
            return name
    given = ", ".join(f"{field}={getattr(config, field)!r}" for field in stem)
    raise ValueError(f"no timm model builds a hybrid CNN with {given}")


def timm_folder_options(model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The `ViTConfig` options a timm config.json's `model_args` state that its weights do not
    show (`ARCH_FIELDS`); they take precedence over those of its architecture."""
    options = {name: model_args[name] for name in ARCH_FIELDS if name in model_args}
    if options.get("global_pool") == "":  # timm's name for keeping every token
        options["global_pool"] = "none"
    if isinstance(model_args.get("norm_layer"), str):  # a named norm has timm's eps
        options["norm_eps"] = 1e-6
    return options


def _data_config(model: VisionTransformer) -> DataConfig:
    """The model's data config, or timm's ViT default (0.5 / 0.5, bicubic, 0.9)."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    height, width = to_2tuple(model.config.img_size, "img_size")
    chans = model.config.in_chans
    return DataConfig(input_size=(chans, height, width), mean=0.5, std=0.5, crop_pct=0.9)


def _elsewhere(model: VisionTransformer, refused: str) -> str:
    """Where a model the `refused` folder format cannot hold can go instead."""
    other = "timm" if refused == "hf" else "hf"
    check = timm_folder_args if other == "timm" else to_hf_config
    try:
        check(model.config)
    except ValueError:
        return "keep vitkit's own checkpoint (vitkit.save), which holds every option"
    return f"export --format {other} instead (or keep vitkit's own checkpoint)"
