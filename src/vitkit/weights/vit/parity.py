"""The ViT's own parity checks (`parity.check_parity` asks them through the weights registry):
JAX `.npz` files against timm's model of the name with the file read by timm's own npz
loader, torchvision weights against torchvision's builder of their sizes (`vit_b_16` ...), and
what a timm conversion without a name assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ...model import VisionTransformer, ViTConfig, get_config
from ..checkpoint import load_state_dict, weights_file
from ..reference import (
    ACTIVATIONS,
    Outputs,
    Parity,
    ReferenceMismatch,
    created,
    not_installed,
    run,
    strict_load,
    timm_outputs,
)
from .reference import source_model
from .torchvision import TORCHVISION_BUILDERS, torchvision_builder, torchvision_kwargs

# torchvision builders' defaults of what the weights may change.
_TV_DEFAULTS = {"num_classes": 1000, "image_size": 224}


def timm_sizes(config: ViTConfig) -> dict[str, Any]:
    """The sizes of a timm ViT the weights show and that can differ from its name's without
    another function: depth, classes, channels and resolution."""
    return {
        "depth": config.depth,
        "num_classes": config.num_classes,
        "in_chans": config.in_chans,
        "img_size": config.img_size,
    }


def timm_assumed(config: ViTConfig, stated: Mapping[str, Any]) -> tuple[str, ...]:
    """What `from_timm` took without a name that the weights do not record."""
    assumed = []
    if "act_layer" not in stated and config.mlp_layer == "mlp":
        act = ACTIVATIONS.get(config.act_layer, config.act_layer)
        assumed.append(f"the activation ({act} assumed)")
    if "norm_eps" not in stated:
        assumed.append(f"the norm epsilon ({config.norm_eps:g} assumed)")
    if "res_post_norm" not in stated:
        order = "post-norm" if config.res_post_norm else "pre-norm"
        assumed.append(f"the block order ({order} assumed)")
    if "num_heads" not in stated:
        assumed.append(f"the head count ({config.num_heads} assumed)")
    if "global_pool" not in stated and config.global_pool != "map":
        assumed.append(f"the pooling ('{config.global_pool}' assumed)")
    return tuple(assumed)


def jax_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    name = given.get("arch")
    config = model.config
    fields: dict[str, Any] = {}
    if name is None:
        act = ACTIVATIONS.get(config.act_layer, config.act_layer)
        fields = {
            "assumed": (f"the activation ({act} assumed)",),
            "fix": ("arch", "to check against timm"),
        }
    try:
        import timm
        from timm.models.vision_transformer import _load_weights
    except ImportError:
        return not_installed("timm", name and f"timm {name}", **fields)

    def read(load: Callable[[], nn.Module], what: str) -> Outputs:
        try:
            return timm_outputs(load())
        except (KeyError, ValueError, RuntimeError, AssertionError) as err:
            raise ReferenceMismatch(
                f"timm's npz loader cannot read the file into {what} ({err})"
            ) from None

    if name is not None and not timm.is_model(name):
        fields["note"] = f"timm {timm.__version__} does not know {name}"
    elif name is not None:
        kwargs = {**timm_sizes(config), **_jax_sizes(config, name)}

        def named() -> nn.Module:
            built = timm.create_model(name, pretrained=False, **kwargs)
            _load_weights(built, str(path))
            return built

        reference = f"{created(name, kwargs)}, the file read by timm's npz loader"
        return run(
            model, lambda: read(named, f"timm's {name}"), reference=reference, scope="function"
        )
    return run(
        model,
        lambda: read(lambda: source_model("jax", config, path), "that model"),
        reference="timm's npz loader and VisionTransformer",
        scope="mapping",
        **fields,
    )


def _jax_sizes(config: ViTConfig, name: str) -> dict[str, Any]:
    """What the arrays record beyond `_timm_sizes`, which timm takes from them too: width,
    heads, patch size, MLP width and the class token's position."""
    sizes = {
        "embed_dim": config.embed_dim,
        "num_heads": config.num_heads,
        "patch_size": config.patch_size,
        "no_embed_class": config.no_embed_class,
    }
    hidden = round(config.embed_dim * config.mlp_ratio)
    if int(config.embed_dim * get_config(name).mlp_ratio) != hidden:
        ratio = hidden / config.embed_dim
        if int(config.embed_dim * ratio) != hidden:  # float rounding below `hidden`
            ratio = (hidden + 0.5) / config.embed_dim
        sizes["mlp_ratio"] = ratio
    return sizes


def torchvision_parity(model: VisionTransformer, path: Path, given: dict[str, Any]) -> Parity:
    config = model.config
    arch = given.get("arch")
    builder = arch if arch in TORCHVISION_BUILDERS else torchvision_builder(config)
    fields: dict[str, Any] = {"assumed": ()}
    if builder is None and "num_heads" not in given and arch is None:  # no name gave them
        fields = {
            "assumed": (f"the head count ({config.num_heads} assumed)",),
            "fix": ("num_heads", "if it differs"),
        }
    if config.conv_stem:
        stem = "the conv stem's strides, BatchNorm eps and activation (2, 1e-5, ReLU assumed)"
        fields["assumed"] += (stem,)
    try:
        import torchvision
    except ImportError:
        return not_installed("torchvision", builder and f"torchvision {builder}", **fields)
    weights = load_state_dict(weights_file(path))
    if builder is not None:
        kwargs = {"num_classes": config.num_classes, "image_size": config.img_size}
        shown = [f"{k}={v}" for k, v in kwargs.items() if v != _TV_DEFAULTS[k]]
        reference = f"torchvision {builder}" + (f" ({', '.join(shown)})" if shown else "")

        def build() -> nn.Module:
            return getattr(torchvision.models, builder)(weights=None, **kwargs)
    else:
        reference = "torchvision's VisionTransformer"

        def build() -> nn.Module:
            return torchvision.models.VisionTransformer(**torchvision_kwargs(config))

    def outputs() -> Outputs:
        built = build().eval()
        strict_load(built, weights)
        return lambda x: {"output": built(x)}

    return run(model, outputs, reference=reference, scope="function", **fields)
