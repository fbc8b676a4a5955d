"""How a model describes its forward pass, stage by stage, for `vitkit.summary.flow`.

A model's `describe_flow(input_size)` returns a `FlowSpec`: plain data naming each stage, what it
does, its layout, the parameters it owns and where its output shape can be measured in one
forward pass (a sub-module's output or input, or an operator called inside a sub-module). The
summary runs the model once, measures every stage and renders the table; it knows no attribute
name of any architecture, so each family describes its own stages the same way; the stages of
the shared layers (patch embedding, attention, MLP) are described here once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from .layers import Attention, GeGLU, Mlp, PatchEmbed, SwiGLU, SwiGLUPacked


@dataclass(frozen=True)
class Output:
    """The shape of the first output of the sub-module at `path` ('' for the model)."""

    path: str


@dataclass(frozen=True)
class Input:
    """The shape of the first tensor the sub-module at `path` receives."""

    path: str


@dataclass(frozen=True)
class Op:
    """The `nth` call (negative: from the end) of a torch function named one of `names` made
    directly in the sub-module at `scope`; `aten=True` looks at the aten operators below the
    functions instead (what runs inside `nn.MultiheadAttention`), `ndim` keeps only results of
    that many dimensions. Its output shape, or with `arg` its `arg`-th tensor input's."""

    scope: str
    names: tuple[str, ...]
    nth: int = 0
    aten: bool = False
    ndim: int | None = None
    arg: int | None = None


@dataclass(frozen=True)
class Unfold:
    """The shape `F.unfold(x, kernel, stride=kernel)` would give for the input x of the
    sub-module at `path`: (B, C * kh * kw, patches). A view the model does not compute (a patch
    convolution read as unfold + linear)."""

    path: str
    kernel: tuple[int, int]


Measure = Output | Input | Op | Unfold


@dataclass(frozen=True)
class Stage:
    """One stage of the forward pass: the sub-module (or model attribute) that runs it, what it
    does, the layout of its output and where to measure that output's shape; the parameters it
    owns (None: another view of the stage above, which owns them) and its block index."""

    name: str
    role: str
    detail: str
    layout: str
    measure: Measure
    params: int | None = 0
    block: int | None = None


@dataclass(frozen=True)
class FlowSpec:
    """A model's forward pass as stages, and what the summary line reports.

    Args:
        stages: in the order they run.
        encoder: the kind of blocks ('native', 'torch').
        blocks: the path of the block container, the prefix of each block's stage names
            (`{blocks}.{index}`): blocks that repeat block 0 are folded into one line.
        grid: the patch grid (rows, columns) of the input.
        patches, tokens: where the number of patches and of tokens (dimension 1) is measured.
        legend: what the letters of the stages' layouts stand for.
        fold: 'identical': blocks after the first fold into one line when every block
            repeats block 0 exactly (a ViT); 'pattern': each block whose stages repeat an
            earlier block's (names within the block, roles, layouts; on another map size)
            folds into one line of its own (a Swin's stages of halving maps).
    """

    stages: tuple[Stage, ...]
    encoder: str
    blocks: str
    grid: tuple[int, int]
    patches: Measure
    tokens: Measure
    legend: str
    fold: str = "identical"


# -- the stages of the shared layers (layers/), for every family's description ---------------

TOKEN = "(B, N, D)"


def param_count(module: nn.Module | nn.Parameter | None) -> int:
    if isinstance(module, nn.Parameter):
        return module.numel()
    if isinstance(module, nn.Module):
        return sum(p.numel() for p in module.parameters())
    return 0


def module_stage(
    root: nn.Module, path: str, role: str, detail: str, layout: str, block: int | None = None
) -> Stage:
    """The stage a sub-module runs: its output, and the parameters it owns."""
    return Stage(
        path, role, detail, layout, Output(path), param_count(root.get_submodule(path)), block
    )


def layer_kind(module: nn.Module) -> str:
    """A layer's name as a reader knows it ('LayerNorm', 'GELU (tanh)', 'SiLU')."""
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"GELU ({module.approximate})"
    return type(module).__name__


def optional_stages(
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
    return [module_stage(root, path, role, detail or layer_kind(module), layout, block)]


def patch_embed_stages(root: nn.Module, path: str) -> list[Stage]:
    """A `PatchEmbed`: the conv stem, the patch projection (a convolution, also shown as the
    unfold + linear it equals, or an unfold and a Linear), the flattening and the norm."""
    embed: PatchEmbed = root.get_submodule(path)
    ph, pw = embed.patch_size
    stages = []
    if embed.backbone is not None:
        for name, child in embed.backbone.named_children():
            detail = layer_kind(child)
            if isinstance(child, nn.Conv2d):
                (kh, kw), (stride, _) = child.kernel_size, child.stride
                detail = (
                    f"Conv2d {child.in_channels}->{child.out_channels}, {kh}x{kw}, stride {stride}"
                )
            stem = f"{path}.backbone.{name}"
            stages.append(module_stage(root, stem, "conv stem", detail, "(B, C', H', W')"))
    proj, cut = embed.proj, f"nn.Unfold cuts {ph}x{pw} patches, each flattened"
    if isinstance(proj, nn.Identity):  # the stem ends at width D (ViTamin): pixels are tokens
        flat = Op(path, ("transpose",))
        stages.append(Stage(path, "flatten", "flatten(2).transpose(1, 2)", "(B, P, D)", flat))
    elif embed.unfold is None:
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
    return stages + optional_stages(root, f"{path}.norm", "patch norm", "(B, P, D)", None)


def scores_stages(path: str, block: int | None = None, bias: list[Stage] = ()) -> list[Stage]:
    """The attention proper, written out in the module at `path` on heads q, k, v (B, heads,
    N, hd): logits q k^T * scale, any position `bias` stages, softmax, weighted values and the
    merged heads (the first and second `matmul` of that module, its `softmax`, its `flatten`)."""

    def op(role: str, detail: str, layout: str, name: str, nth: int = 0) -> Stage:
        return Stage(path, role, detail, layout, Op(path, (name,), nth), 0, block)

    heads = "(B, heads, N, N)"
    return [
        op("attention logits", "q @ k^T * scale", heads, "matmul", 0),
        *bias,
        op("softmax", "over the keys: each row sums to 1", heads, "softmax"),
        op("weighted values", "softmax @ v", "(B, heads, N, hd)", "matmul", 1),
        op("merge heads", "transpose(1, 2) + flatten", TOKEN, "flatten"),
    ]


def biased_qkv_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """BEiT's qkv (EVA's too): the `qkv` Linear's weight read by `F.linear` with the separate
    `q_bias` / `v_bias` (keys never biased) where the attention has them, then the heads."""
    attn = root.get_submodule(path)
    dim = attn.qkv.in_features
    if attn.q_bias is not None:
        biases = "q and v biases"
    else:
        biases = "bias" if attn.qkv.bias is not None else "no bias"
    params = sum(param_count(p) for p in (attn.qkv, attn.q_bias, attn.v_bias))
    detail, qkv = f"Linear {dim}->{3 * dim}, {biases}", Op(path, ("linear",))
    heads, split = "reshape + permute into q, k, v", Op(path, ("permute",))
    return [
        Stage(path, "qkv projection", detail, "(B, N, 3*D)", qkv, params, block),
        Stage(path, "split heads", heads, "(3, B, heads, N, hd)", split, 0, block),
    ]


def attention_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """An `Attention` on its explicit path: qkv, heads, softmax(q k^T * scale) v, projection."""
    attn: Attention = root.get_submodule(path)
    dim = attn.qkv.in_features

    def layer(name: str, role: str, detail: str, layout: str) -> Stage:
        return module_stage(root, f"{path}.{name}", role, detail, layout, block)

    heads = "(B, heads, N, hd)"
    split = Op(path, ("permute",))
    detail = "reshape + permute into q, k, v"
    return [
        layer("qkv", "qkv projection", f"Linear {dim}->{3 * dim}", "(B, N, 3*D)"),
        Stage(path, "split heads", detail, "(3, B, heads, N, hd)", split, 0, block),
        *optional_stages(root, f"{path}.q_norm", "query norm", heads, block),
        *optional_stages(root, f"{path}.k_norm", "key norm", heads, block),
        *scores_stages(path, block),
        *optional_stages(root, f"{path}.norm", "merged heads norm", TOKEN, block),
        layer("proj", "attention projection", f"Linear {dim}->{dim}", TOKEN),
    ]


def mlp_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """An `Mlp` (Linear + activation, Linear), `SwiGLU` or `SwiGLUPacked` (gated hidden);
    `GeGLU` (ViTamin's: a norm, then a gated hidden) in `geglu_stages`."""
    mlp: Mlp | SwiGLU | SwiGLUPacked | GeGLU = root.get_submodule(path)
    if isinstance(mlp, GeGLU):
        return geglu_stages(root, path, block)
    act, hidden, dim = layer_kind(mlp.act), mlp.fc2.in_features, mlp.fc2.out_features
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
    return [
        *stages,
        *optional_stages(root, f"{path}.norm", "MLP hidden norm", layout, block),
        output,
    ]


def geglu_stages(root: nn.Module, path: str, block: int | None = None) -> list[Stage]:
    """A `GeGLU`: its input norm, gate `w0` (with the activation) and value `w1`, their product
    and the output `w2`."""
    mlp: GeGLU = root.get_submodule(path)
    act, hidden, dim = layer_kind(mlp.act), mlp.w2.in_features, mlp.w2.out_features
    layout = "(B, N, hidden)"

    def layer(name: str, role: str, detail: str, shape: str) -> Stage:
        return module_stage(root, f"{path}.{name}", role, detail, shape, block)

    gate = layer("w0", "MLP gate", f"Linear {dim}->{hidden} + {act}", layout)
    return [
        layer("norm", "MLP input norm", layer_kind(mlp.norm), TOKEN),
        replace(gate, measure=Output(f"{path}.act")),
        layer("w1", "MLP value", f"Linear {dim}->{hidden}", layout),
        Stage(path, "gated hidden", "act(gate) * value", layout, Op(path, ("mul",)), 0, block),
        layer("w2", "MLP output", f"Linear {hidden}->{dim}", TOKEN),
    ]


def residual_block_stages(
    root: nn.Module,
    path: str,
    block: int,
    branches: tuple[list[Stage], list[Stage]],
    scales: tuple[list[Stage], list[Stage]] = ([], []),
    post: bool = False,
) -> list[Stage]:
    """A transformer block around its attention and MLP `branches`: x + scale(attention(
    norm1(x))), then x + scale(mlp(norm2(x))) (pre-norm), or with `post` each branch's output
    normalised instead (res-post-norm); `scales` are the LayerScale stages, the residuals the
    block's first and second `add`."""
    module = root.get_submodule(path)

    def norm(name: str, role: str) -> Stage:
        detail = layer_kind(module.get_submodule(name)) + (" of the branch" if post else "")
        return module_stage(root, f"{path}.{name}", role, detail, TOKEN, block)

    def residual(branch: str, nth: int) -> Stage:
        return Stage(path, "residual", f"x + {branch}", TOKEN, Op(path, ("add",), nth), 0, block)

    attn, mlp = branches
    if post:
        attn, mlp = attn + [norm("norm1", "attention norm")], mlp + [norm("norm2", "MLP norm")]
    else:
        attn, mlp = [norm("norm1", "attention norm"), *attn], [norm("norm2", "MLP norm"), *mlp]
    return [*attn, *scales[0], residual("attention", 0), *mlp, *scales[1], residual("MLP", 1)]


def gamma_stages(root: nn.Module, path: str, block: int) -> tuple[list[Stage], list[Stage]]:
    """LayerScale held by the block at `path` as parameters `gamma_1`, `gamma_2` (BEiT's and
    EVA's names; None where unscaled), each a `mul` of that block."""
    module, out, nth = root.get_submodule(path), [], 0
    for name in ("gamma_1", "gamma_2"):
        gamma = getattr(module, name, None)
        if gamma is None:
            out.append([])
            continue
        measure, params = Op(path, ("mul",), nth), gamma.numel()
        detail = f"x * {name}"
        out.append([Stage(f"{path}.{name}", "layer scale", detail, TOKEN, measure, params, block)])
        nth += 1
    return out[0], out[1]


# -- the stages around the blocks of a ViT-like model (prefix tokens, positions, pool, head) -

TOKEN_KINDS = {"cls_token": "class", "dist_token": "distillation", "reg_token": "register"}


def token_stages(root: nn.Module) -> list[Stage]:
    """The prefix tokens the model holds (`TOKEN_KINDS`) joined before the patches by the
    model's own `cat`; none without them."""
    prefix = [(name, kind, getattr(root, name, None)) for name, kind in TOKEN_KINDS.items()]
    prefix = [(name, kind, param) for name, kind, param in prefix if param is not None]
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


def position_stage(
    root: nn.Module, kind: str = "learned table", rows: str = "N", measure: Measure | None = None
) -> list[Stage]:
    """The absolute positions `pos_embed` added to the tokens (none without them): a `kind`
    table (1, `rows`, D), measured at the input of `pos_drop` unless `measure` says."""
    if root.pos_embed is None:
        return []
    detail, params = f"x + {kind} (1, {rows}, D)", param_count(root.pos_embed)
    layout = TOKEN if rows == "N" else "(B, P, D)"
    measure = measure or Input("pos_drop")
    return [Stage("pos_embed", "position add", detail, layout, measure, params)]


def opening_stages(
    root: nn.Module, position_kind: str = "learned table", positions_first: bool = False
) -> list[Stage]:
    """The stages before the blocks of a ViT-like model: the image, its patch embedding, the
    prefix tokens joined and the absolute positions (a `position_kind` table) added; with
    `positions_first`, the positions go to the patches before the tokens join (EVA's
    `no_embed_class`)."""
    tokens = token_stages(root)
    if positions_first:
        positions = position_stage(root, position_kind, rows="P", measure=Op("", ("add",)))
        embed = [*positions, *tokens]
    else:
        embed = [*tokens, *position_stage(root, position_kind)]
    image = Stage("input", "image", "", "(B, C, H, W)", Input(""))
    return [image, *patch_embed_stages(root, "patch_embed"), *embed]


def closing_stages(
    root: nn.Module, over: str, heads: tuple[tuple[str, str], ...] = (("head", "head"),)
) -> list[Stage]:
    """The stages after the blocks of a ViT-like model: the final norm, the pooling over
    `over` (`pool_stage`), `fc_norm` and the heads (`head_stages`)."""
    return [
        *optional_stages(root, "norm", "final norm", TOKEN, None),
        pool_stage(root, over),
        *head_stages(root, heads),
    ]


def pool_stage(root: nn.Module, over: str) -> Stage:
    """What the model's `global_pool` does with the tokens before `fc_norm`: the class token,
    a mean / max over `over` (the patch tokens, all tokens), the attention pool `attn_pool`,
    or nothing."""
    pool, shape = root.global_pool, Input("fc_norm")
    if pool == "token":
        return Stage("pool", "pooling", "class token x[:, 0]", "(B, D)", shape)
    if pool == "none":
        return Stage("pool", "pooling", "none: every token goes on", TOKEN, shape)
    if pool == "map":
        detail = f"attention pool (attn_pool): a learned query attends over {over}"
        return Stage("attn_pool", "pooling", detail, "(B, D)", shape, param_count(root.attn_pool))
    reduce = {"avg": "mean", "max": "max", "avgmax": "(mean + max) / 2"}[pool]
    return Stage("pool", "pooling", f"{reduce} of {over}", "(B, D)", shape)


def head_stages(root: nn.Module, heads: tuple[tuple[str, str], ...] = (("head", "head"),)) -> list:
    """`fc_norm` and each Linear head (attribute, role) the model has."""
    stages = optional_stages(root, "fc_norm", "norm after pooling", "(B, D)", None)
    for name, role in heads:
        head = getattr(root, name, None)
        if isinstance(head, nn.Linear):
            detail = f"Linear {head.in_features}->{head.out_features}"
            stages.append(module_stage(root, name, role, detail, "(B, classes)"))
    return stages
