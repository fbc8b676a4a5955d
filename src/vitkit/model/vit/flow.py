"""The Vision Transformer's forward pass as stages (`VisionTransformer.describe_flow`), for
`vitkit.summary.flow`: the paper's steps (Dosovitskiy et al., ICLR 2021, Eq. 1-4) named after
the modules that run them, each with the place its output shape is measured (`stages.py`).

The layer describers (`patch_embed_stages`, `attention_stages`, `mlp_stages`, `block_stages`)
take a module and its path, so another architecture built of the same layers reuses them.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..layers import (
    Block,
    ResPostBlock,
    WindowBlock,
)
from ..stages import (
    TOKEN,
    FlowSpec,
    Input,
    Op,
    Output,
    Stage,
    attention_stages,
    layer_kind,
    mlp_stages,
    module_stage,
    optional_stages,
    param_count,
    patch_embed_stages,
)
from .torch_encoder import torch_layer_stages

MAP = "(B, H, W, D)"
LEGEND = (
    "B batch, C channels, H x W image, D width, P patches, N tokens (P + prefix tokens), "
    "hd head width (D / heads), hidden the MLP's width (D * mlp_ratio)"
)
WINDOW_LEGEND = "; in window blocks B*win windows of ws x ws patches, N = ws * ws"


def block_stages(root: nn.Module, path: str, block: int) -> list[Stage]:
    """A `Block`: x + proj(attention(norm1(x))), then x + mlp(norm2(x)), each branch through
    its LayerScale; a `ResPostBlock` normalises each branch's output instead."""
    module: Block = root.get_submodule(path)
    post = isinstance(module, ResPostBlock)

    def norm(name: str, role: str) -> Stage:
        detail = layer_kind(module.get_submodule(name)) + (" of the branch" if post else "")
        return module_stage(root, f"{path}.{name}", role, detail, TOKEN, block)

    def residual(branch: str, nth: int) -> Stage:
        return Stage(path, "residual", f"x + {branch}", TOKEN, Op(path, ("add",), nth), 0, block)

    attn = attention_stages(root, f"{path}.attn", block)
    mlp = mlp_stages(root, f"{path}.mlp", block)
    if post:
        attn, mlp = attn + [norm("norm1", "attention norm")], mlp + [norm("norm2", "MLP norm")]
    else:
        attn, mlp = [norm("norm1", "attention norm"), *attn], [norm("norm2", "MLP norm"), *mlp]
    stages = [
        *attn,
        *optional_stages(root, f"{path}.ls1", "layer scale", TOKEN, block, "x * gamma"),
        residual("attention", 0),
        *mlp,
        *optional_stages(root, f"{path}.ls2", "layer scale", TOKEN, block, "x * gamma"),
        residual("MLP", 1),
    ]
    return _on_maps(stages, module, path, block) if isinstance(module, WindowBlock) else stages


def _on_maps(stages: list[Stage], module: WindowBlock, path: str, block: int) -> list[Stage]:
    """A ViTDet `WindowBlock`'s stages: the block's own on maps (B, H, W, D), the window
    partition and merge around the attention (whose batch then counts windows), the relative
    positions added to its logits."""
    window, attn = module.window_size, f"{path}.attn"
    out = []
    for stage in stages:
        if not stage.name.startswith(attn):
            stage = replace(stage, layout=stage.layout.replace("N", "H, W"))
        out.append(stage)
        if stage.role == "attention norm" and window:
            detail = f"zero-pad to whole {window}x{window} windows, one batch row each"
            measure = Op(path, ("reshape",), 1)
            out.append(Stage(path, "window partition", detail, "(B*win, ws, ws, D)", measure))
        if stage.role == "attention logits" and module.attn.rel_pos_h is not None:
            params = param_count(module.attn.rel_pos_h) + param_count(module.attn.rel_pos_w)
            detail = "+ q . R_h[i - k] + q . R_w[j - l] (decomposed)"
            measure = Op(attn, ("add",), -1)
            out.append(Stage(attn, "relative positions", detail, stage.layout, measure, params))
        if stage.role == "attention projection":
            shape = "(B*win, ws, ws, D)" if window else MAP
            out.append(Stage(attn, "to map", "reshape", shape, Op(attn, ("reshape",), -1)))
            if window:
                detail, measure = "windows back in place, padding cut", Op(path, ("__getitem__",))
                out.append(Stage(path, "window merge", detail, MAP, measure))
    return [replace(stage, block=block) for stage in out]


def _token_stage(model: nn.Module) -> list[Stage]:
    """The prefix tokens joined before the patches (none without them)."""
    tokens = {
        "cls_token": ("class", model.cls_token),
        "dist_token": ("distillation", model.dist_token),
        "reg_token": ("register", model.reg_token),
    }
    prefix = [(name, kind, param) for name, (kind, param) in tokens.items() if param is not None]
    if not prefix:
        return []
    kinds = [kind for _, kind, _ in prefix]
    label = " and ".join(kinds) + (" token" if kinds == ["class"] else " tokens")
    return [
        Stage(
            " + ".join(name for name, _, _ in prefix),
            "token concat",
            f"prepend the {label} to the patches",
            TOKEN,
            Op("", ("cat",)),
            sum(param_count(param) for _, _, param in prefix),
        )
    ]


def _position_stage(model: nn.Module) -> list[Stage]:
    if model.pos_embed is None:
        return []
    learned = isinstance(model.pos_embed, nn.Parameter)
    kind = "learned table" if learned else f"fixed {model.pos_embed_kind} table (not trained)"
    detail, params = f"x + {kind} (1, N, D)", param_count(model.pos_embed)
    return [Stage("pos_embed", "position add", detail, TOKEN, Input("pos_drop"), params)]


def _pool_stage(model: nn.Module) -> Stage:
    """What `VisionTransformer.pool` does with the tokens: the class token, a mean / max over
    the patch tokens (or all tokens), the attention-pool head, or nothing."""
    pool, shape = model.global_pool, Input("fc_norm")
    if pool == "token":
        return Stage("pool", "pooling", "class token x[:, 0]", "(B, D)", shape)
    if pool == "none":
        return Stage("pool", "pooling", "none: every token goes on", TOKEN, shape)
    over = "all tokens" if model.pool_include_prefix else "the patch tokens"
    if pool == "map":
        detail = f"attention pool (attn_pool): a learned query attends over {over}"
        return Stage("attn_pool", "pooling", detail, "(B, D)", shape, param_count(model.attn_pool))
    reduce = {"avg": "mean", "max": "max", "avgmax": "(mean + max) / 2"}[pool]
    return Stage("pool", "pooling", f"{reduce} of {over}", "(B, D)", shape)


def _head_stages(model: nn.Module) -> list[Stage]:
    """fc_norm, the head(s), and a distilled model's average of its two heads."""
    stages = optional_stages(model, "fc_norm", "norm after pooling", "(B, D)", None)
    for name, role in (("head", "head"), ("head_dist", "distillation head")):
        head = getattr(model, name)
        if isinstance(head, nn.Linear):
            detail = f"Linear {head.in_features}->{head.out_features}"
            stages.append(module_stage(model, name, role, detail, "(B, classes)"))
    if isinstance(model.head_dist, nn.Linear):
        average = "(head + head_dist) / 2"
        stages.append(Stage("", "average", average, "(B, classes)", Op("", ("div",))))
    return stages


def describe_vit(model: nn.Module, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage."""
    stages = [
        Stage("input", "image", "", "(B, C, H, W)", Input("")),
        *patch_embed_stages(model, "patch_embed"),
        *_token_stage(model),
        *_position_stage(model),
        *optional_stages(model, "norm_pre", "norm before the blocks", TOKEN, None),
    ]
    if model.spatial_blocks:  # ViTDet's blocks hold maps
        detail = "reshape the tokens to the patch grid"
        stages.append(Stage("blocks", "to map", detail, MAP, Input("blocks.0")))
    torch_blocks = isinstance(model.blocks, nn.TransformerEncoder)
    container = "blocks.layers" if torch_blocks else "blocks"
    for i in range(len(model.block_list())):
        describe = torch_layer_stages if torch_blocks else block_stages
        stages += describe(model, f"{container}.{i}", i)
    stages += [
        *optional_stages(model, "norm", "final norm", TOKEN, None),
        _pool_stage(model),
        *_head_stages(model),
    ]
    return FlowSpec(
        stages=tuple(stages),
        encoder=model.config.encoder,
        blocks=container,
        grid=model.patch_embed.grid_for(*input_size[-2:]),
        patches=Output("patch_embed"),
        tokens=Output("patch_embed") if model.spatial_blocks else Input("blocks"),
        legend=LEGEND + (WINDOW_LEGEND if model.config.window_size else ""),
    )
