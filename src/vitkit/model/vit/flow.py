"""The Vision Transformer's forward pass as stages (`VisionTransformer.describe_flow`), for
`vitkit.summary.flow`: the paper's steps (Dosovitskiy et al., ICLR 2021, Eq. 1-4) named after
the modules that run them, each with the place its output shape is measured (`stages.py`).

The shared layers' describers (`patch_embed_stages`, `attention_stages`, `mlp_stages`, the
residual block, the prefix tokens, positions, pooling and heads) are `stages.py`'s, shared
with the other families' flows.
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
    closing_stages,
    mlp_stages,
    opening_stages,
    optional_stages,
    param_count,
    residual_block_stages,
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
    branches = (
        attention_stages(root, f"{path}.attn", block),
        mlp_stages(root, f"{path}.mlp", block),
    )
    scales = tuple(
        optional_stages(root, f"{path}.{name}", "layer scale", TOKEN, block, "x * gamma")
        for name in ("ls1", "ls2")
    )
    post = isinstance(module, ResPostBlock)
    stages = residual_block_stages(root, path, block, branches, scales, post)
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


def _position_kind(model: nn.Module) -> str:
    learned = isinstance(model.pos_embed, nn.Parameter)
    return "learned table" if learned else f"fixed {model.pos_embed_kind} table (not trained)"


def _closing_stages(model: nn.Module) -> list[Stage]:
    """The final norm, the pooling, fc_norm, the head(s), and a distilled model's average of
    its two heads."""
    over = "all tokens" if model.pool_include_prefix else "the patch tokens"
    heads = (("head", "head"), ("head_dist", "distillation head"))
    stages = closing_stages(model, over, heads)
    if isinstance(model.head_dist, nn.Linear):
        average = "(head + head_dist) / 2"
        stages.append(Stage("", "average", average, "(B, classes)", Op("", ("div",))))
    return stages


def describe_vit(model: nn.Module, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage."""
    stages = [
        *opening_stages(model, _position_kind(model)),
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
    stages += _closing_stages(model)
    return FlowSpec(
        stages=tuple(stages),
        encoder=model.config.encoder,
        blocks=container,
        grid=model.patch_embed.grid_for(*input_size[-2:]),
        patches=Output("patch_embed"),
        tokens=Output("patch_embed") if model.spatial_blocks else Input("blocks"),
        legend=LEGEND + (WINDOW_LEGEND if model.config.window_size else ""),
    )
