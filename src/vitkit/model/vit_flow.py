"""The Vision Transformer's forward pass as stages (`VisionTransformer.describe_flow`), for
`vitkit.summary.flow`: the paper's steps (Dosovitskiy et al., ICLR 2021, Eq. 1-4) named after
the modules that run them, each with the place its output shape is measured (`stages.py`).

The layer describers (`patch_embed_stages`, `attention_stages`, `mlp_stages`, `block_stages`)
take a module and its path, so another architecture built of the same layers reuses them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torch import nn

from .layers import (
    Attention,
    Block,
    Mlp,
    PatchEmbed,
    ResPostBlock,
    SwiGLU,
    SwiGLUPacked,
    WindowBlock,
)
from .stages import FlowSpec, Input, Op, Output, Stage, Unfold
from .torch_encoder import torch_layer_stages

if TYPE_CHECKING:
    from .vit import VisionTransformer

TOKEN = "(B, N, D)"
MAP = "(B, H, W, D)"
LEGEND = (
    "B batch, C channels, H x W image, D width, P patches, N tokens (P + prefix tokens), "
    "hd head width (D / heads)"
)
WINDOW_LEGEND = "; in window blocks B*win windows of ws x ws patches, N = ws * ws"


def _params(module: nn.Module | nn.Parameter | None) -> int:
    if isinstance(module, nn.Parameter):
        return module.numel()
    if isinstance(module, nn.Module):
        return sum(p.numel() for p in module.parameters())
    return 0


def module_stage(
    root: nn.Module, path: str, role: str, detail: str, layout: str, block: int | None = None
) -> Stage:
    """The stage a sub-module runs: its output, and the parameters it owns."""
    return Stage(path, role, detail, layout, Output(path), _params(root.get_submodule(path)), block)


def _kind(module: nn.Module) -> str:
    """A layer's name as a reader knows it ('LayerNorm', 'GELU (tanh)', 'SiLU')."""
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"GELU ({module.approximate})"
    return type(module).__name__


def _optional(
    root: nn.Module,
    path: str,
    role: str,
    layout: str,
    block: int | None,
    detail: str | None = None,
) -> list[Stage]:
    """The stage of an optional layer at `path` (none where it is the identity); its detail
    is the layer's kind unless given."""
    module = root.get_submodule(path)
    if isinstance(module, nn.Identity):
        return []
    return [module_stage(root, path, role, detail or _kind(module), layout, block)]


def patch_embed_stages(root: nn.Module, path: str) -> list[Stage]:
    """A `PatchEmbed`: the conv stem, the patch projection (a convolution, also shown as the
    unfold + linear it equals, or an unfold and a Linear), the flattening and the norm."""
    embed: PatchEmbed = root.get_submodule(path)
    ph, pw = embed.patch_size
    stages = []
    if embed.backbone is not None:
        for name, child in embed.backbone.named_children():
            detail = _kind(child)
            if isinstance(child, nn.Conv2d):
                (kh, kw), (stride, _) = child.kernel_size, child.stride
                detail = (
                    f"Conv2d {child.in_channels}->{child.out_channels}, {kh}x{kw}, stride {stride}"
                )
            stem = f"{path}.backbone.{name}"
            stages.append(module_stage(root, stem, "conv stem", detail, "(B, C', H', W')"))
    proj, cut = embed.proj, f"nn.Unfold cuts {ph}x{pw} patches, each flattened"
    if embed.unfold is None:
        chans, dim = proj.in_channels, proj.out_channels
        detail = f"Conv2d {chans}->{dim}, kernel {ph}x{pw}, stride {ph}x{pw}"
        flat, view = Op(path, ("transpose",)), Unfold(f"{path}.proj", (ph, pw))
        linear = f"Linear {chans * ph * pw}->{dim} (the conv weight reshaped)"
        stages += [
            module_stage(root, f"{path}.proj", "patch embedding", detail, "(B, D, H/ph, W/pw)"),
            Stage("  = unfold", "same as", cut, "(B, C*ph*pw, P)", view, None),
            Stage("  = linear", "then", linear, "(B, P, D)", flat, None),
            Stage(path, "flatten", "flatten(2).transpose(1, 2)", "(B, P, D)", flat),
        ]
    else:
        linear = f"Linear {proj.in_features}->{proj.out_features}"
        rows = "transpose(1, 2): one row per patch"
        stages += [
            module_stage(root, f"{path}.unfold", "patch embedding", cut, "(B, C*ph*pw, P)"),
            Stage(path, "flatten", rows, "(B, P, C*ph*pw)", Input(f"{path}.proj")),
            module_stage(root, f"{path}.proj", "patch projection", linear, "(B, P, D)"),
        ]
    return stages + _optional(root, f"{path}.norm", "patch norm", "(B, P, D)", None)


def attention_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """An `Attention` on its explicit path: qkv, heads, softmax(q k^T * scale) v, projection."""
    attn: Attention = root.get_submodule(path)
    dim = attn.qkv.in_features

    def op(role: str, detail: str, layout: str, name: str, nth: int = 0) -> Stage:
        return Stage(path, role, detail, layout, Op(path, (name,), nth), 0, block)

    def layer(name: str, role: str, detail: str, layout: str) -> Stage:
        return module_stage(root, f"{path}.{name}", role, detail, layout, block)

    heads = "(B, heads, N, hd)"
    return [
        layer("qkv", "qkv projection", f"Linear {dim}->{3 * dim}", "(B, N, 3*D)"),
        op("split heads", "reshape + permute into q, k, v", "(3, B, heads, N, hd)", "permute"),
        *_optional(root, f"{path}.q_norm", "query norm", heads, block),
        *_optional(root, f"{path}.k_norm", "key norm", heads, block),
        op("attention logits", "q @ k^T * scale", "(B, heads, N, N)", "matmul", 0),
        op("softmax", "over the keys: each row sums to 1", "(B, heads, N, N)", "softmax"),
        op("weighted values", "softmax @ v", heads, "matmul", 1),
        op("merge heads", "transpose(1, 2) + flatten", TOKEN, "flatten"),
        *_optional(root, f"{path}.norm", "merged heads norm", TOKEN, block),
        layer("proj", "attention projection", f"Linear {dim}->{dim}", TOKEN),
    ]


def mlp_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """An `Mlp` (Linear + activation, Linear), `SwiGLU` or `SwiGLUPacked` (gated hidden)."""
    mlp: Mlp | SwiGLU | SwiGLUPacked = root.get_submodule(path)
    act, hidden, dim = _kind(mlp.act), mlp.fc2.in_features, mlp.fc2.out_features
    layout = "(B, N, hidden)"

    def layer(name: str, role: str, detail: str, measure: str | None = None) -> Stage:
        stage = module_stage(root, f"{path}.{name}", role, detail, layout, block)
        if measure is None:
            return stage
        return replace(stage, measure=Output(f"{path}.{measure}"))  # e.g. after the activation

    gate = Stage(path, "gated hidden", "act(gate) * value", layout, Op(path, ("mul",)), 0, block)
    if isinstance(mlp, SwiGLU):
        stages = [
            layer("fc1_g", "MLP gate", f"Linear {dim}->{hidden} + {act}", measure="act"),
            layer("fc1_x", "MLP value", f"Linear {dim}->{hidden}"),
            gate,
        ]
    elif isinstance(mlp, SwiGLUPacked):
        stages = [layer("fc1", "MLP hidden", f"Linear {dim}->{2 * hidden}, gate and value packed")]
        stages.append(gate)
    else:
        stages = [layer("fc1", "MLP hidden", f"Linear {dim}->{hidden} + {act}", measure="act")]
    output = module_stage(root, f"{path}.fc2", "MLP output", f"Linear {hidden}->{dim}", TOKEN)
    output = replace(output, block=block)
    return [*stages, *_optional(root, f"{path}.norm", "MLP hidden norm", layout, block), output]


def block_stages(root: nn.Module, path: str, block: int) -> list[Stage]:
    """A `Block`: x + proj(attention(norm1(x))), then x + mlp(norm2(x)), each branch through
    its LayerScale; a `ResPostBlock` normalises each branch's output instead."""
    module: Block = root.get_submodule(path)
    post = isinstance(module, ResPostBlock)

    def norm(name: str, role: str) -> Stage:
        detail = _kind(module.get_submodule(name)) + (" of the branch" if post else "")
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
        *_optional(root, f"{path}.ls1", "layer scale", TOKEN, block, "x * gamma"),
        residual("attention", 0),
        *mlp,
        *_optional(root, f"{path}.ls2", "layer scale", TOKEN, block, "x * gamma"),
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
            params = _params(module.attn.rel_pos_h) + _params(module.attn.rel_pos_w)
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


def _token_stage(model: VisionTransformer) -> list[Stage]:
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
            sum(_params(param) for _, _, param in prefix),
        )
    ]


def _position_stage(model: VisionTransformer) -> list[Stage]:
    if model.pos_embed is None:
        return []
    learned = isinstance(model.pos_embed, nn.Parameter)
    kind = "learned table" if learned else f"fixed {model.pos_embed_kind} table (not trained)"
    detail, params = f"x + {kind} (1, N, D)", _params(model.pos_embed)
    return [Stage("pos_embed", "position add", detail, TOKEN, Input("pos_drop"), params)]


def _pool_stage(model: VisionTransformer) -> Stage:
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
        return Stage("attn_pool", "pooling", detail, "(B, D)", shape, _params(model.attn_pool))
    reduce = {"avg": "mean", "max": "max", "avgmax": "(mean + max) / 2"}[pool]
    return Stage("pool", "pooling", f"{reduce} of {over}", "(B, D)", shape)


def _head_stages(model: VisionTransformer) -> list[Stage]:
    """fc_norm, the head(s), and a distilled model's average of its two heads."""
    stages = _optional(model, "fc_norm", "norm after pooling", "(B, D)", None)
    for name, role in (("head", "head"), ("head_dist", "distillation head")):
        head = getattr(model, name)
        if isinstance(head, nn.Linear):
            detail = f"Linear {head.in_features}->{head.out_features}"
            stages.append(module_stage(model, name, role, detail, "(B, classes)"))
    if isinstance(model.head_dist, nn.Linear):
        average = "(head + head_dist) / 2"
        stages.append(Stage("", "average", average, "(B, classes)", Op("", ("div",))))
    return stages


def describe_vit(model: VisionTransformer, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage."""
    stages = [
        Stage("input", "image", "", "(B, C, H, W)", Input("")),
        *patch_embed_stages(model, "patch_embed"),
        *_token_stage(model),
        *_position_stage(model),
        *_optional(model, "norm_pre", "norm before the blocks", TOKEN, None),
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
        *_optional(model, "norm", "final norm", TOKEN, None),
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
