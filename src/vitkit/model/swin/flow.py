"""The Swin Transformer's forward pass as stages (`SwinTransformer.describe_flow`), for
`vitkit.summary.flow`: the patch embedding as a map, then per stage the patch merging and each
block's window partition, attention per window (relative position bias, the shift mask),
window reverse and the cyclic shift, MLP; the final norm, pooling and head.

Liu et al., "Swin Transformer" (ICCV 2021), Section 3 and Fig. 3; Swin V2 (CVPR 2022),
Section 3.1-3.3. Each stage names where its output shape is measured in one forward pass (the
model's own windows, clamps and shifts: nothing here computes a shape); the patch embedding and
MLP describers are the shared layers' (`model/stages.py`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..stages import (
    FlowSpec,
    Input,
    Op,
    Output,
    Stage,
    mlp_stages,
    module_stage,
    patch_embed_stages,
)
from .config import stage_resolution
from .stage import PatchMerging, SwinBlock

MAP = "(B, H, W, C)"
WINDOWS = "(B*nW, N, C)"
HEADS = "(B*nW, heads, N, N)"
LEGEND = (
    "B batch, C channels (the image's, then the map's), H x W the image then each stage's map, "
    "ph x pw patch, P patches, D embedding width, Hp x Wp the map padded to whole windows, "
    "nW windows per image, N = wh * ww tokens of a window, hd head width (C / heads), hidden "
    "the MLP's width (C * mlp_ratio)"
)


def _attention_stages(root: nn.Module, path: str, block: int, cosine: bool) -> list[Stage]:
    """A window attention on the windows (B * nW, N, C): qkv, heads, logits (scaled dot
    product, or V2's cosine times a clamped scale), the relative position bias, the softmax."""
    attn = root.get_submodule(path)
    dim = attn.proj.in_features

    def op(role: str, detail: str, layout: str, name: str, nth: int = 0, params=0) -> Stage:
        return Stage(path, role, detail, layout, Op(path, (name,), nth), params, block)

    def count(*names: str) -> int:
        return sum(p.numel() for n in names for p in attn.get_submodule(n).parameters())

    if cosine:  # V2: F.linear with the q / v biases, not the qkv module's call
        qkv = op(
            "qkv projection",
            f"Linear {dim}->{3 * dim}" + (", q and v biases" if attn.q_bias is not None else ""),
            "(B*nW, N, 3*C)",
            "linear",
            params=attn.qkv.weight.numel() + 2 * dim * (attn.q_bias is not None),
        )
        logits = op(
            "attention logits",
            "cos(q, k) * exp(min(logit_scale, log 100))",
            HEADS,
            "mul",
            0,
            attn.logit_scale.numel(),
        )
        bias = op(
            "position bias",
            "16 * sigmoid(cpb_mlp(log-spaced offsets)), per head",
            "(1, heads, N, N)",
            "mul",
            1,
            count("cpb_mlp"),
        )
    else:
        qkv = module_stage(
            root,
            f"{path}.qkv",
            "qkv projection",
            f"Linear {dim}->{3 * dim}",
            "(B*nW, N, 3*C)",
            block,
        )
        logits = op("attention logits", "q @ k^T * scale", HEADS, "matmul", 0)
        rows = attn.relative_position_bias_table.shape[0]
        bias = op(
            "position bias",
            f"table ({rows}, heads) read at each pair's offset",
            "(1, heads, N, N)",
            "unsqueeze",
            0,
            attn.relative_position_bias_table.numel(),
        )
    return [
        qkv,
        op("split heads", "reshape + permute into q, k, v", "(3, B*nW, heads, N, hd)", "permute"),
        logits,
        bias,
        op("bias added", "logits + position bias", HEADS, "add", 0),
    ]


def _window_stages(root: nn.Module, path: str, block: int, grid: tuple[int, int]) -> list:
    """A block's window attention on its map (B, H, W, C): shift, pad, partition, attention
    per window (the mask where shifted), reverse, crop and shift back. `grid` is the block's
    map at this input, for the descriptions only (the shapes are measured)."""
    module: SwinBlock = root.get_submodule(path)
    (wh, ww), shift = module.window_size, module.shift_size
    shifted, attn = any(shift), f"{path}.attn"

    def stage(role: str, detail: str, layout: str, measure, owner: str = path) -> Stage:
        return Stage(owner, role, detail, layout, measure, 0, block)

    out = []
    if shifted:
        detail = f"roll by ({-shift[0]}, {-shift[1]}): windows straddle the last block's borders"
        out.append(stage("cyclic shift", detail, MAP, Op(path, ("roll",), 0)))
    pad = (-grid[0] % wh, -grid[1] % ww)
    if any(pad):
        detail = f"zero rows / columns ({pad[0]}, {pad[1]}) to whole {wh}x{ww} windows"
        out.append(stage("pad", detail, "(B, Hp, Wp, C)", Op(path, ("pad",), 0)))
    if (wh, ww) == tuple(grid) and not shifted:
        role, detail = "one window", f"the {wh}x{ww} map is the window (clamped), so no shift"
    else:
        role, detail = "window partition", f"{wh}x{ww} windows, each a batch row"
    out.append(stage(role, detail, WINDOWS, Input(attn)))
    cosine, dim = hasattr(module.attn, "logit_scale"), module.attn.proj.in_features
    out += _attention_stages(root, attn, block, cosine)
    if shifted:
        detail = "+ (nW, N, N): -100 between tokens the roll brought from apart"
        out.append(stage("shift mask", detail, "(B, nW, heads, N, N)", Op(attn, ("add",), 1), attn))
    out += [
        stage("softmax", "over the keys of the window", HEADS, Op(attn, ("softmax",)), attn),
        stage(
            "weighted values",
            "softmax @ v",
            "(B*nW, heads, N, hd)",
            Op(attn, ("matmul",), -1),
            attn,
        ),
        stage("merge heads", "transpose + reshape", WINDOWS, Op(attn, ("reshape",), -1), attn),
        module_stage(
            root, f"{attn}.proj", "attention projection", f"Linear {dim}->{dim}", WINDOWS, block
        ),
        stage(
            "window reverse", "windows back in place", "(B, Hp, Wp, C)", Op(path, ("reshape",), -1)
        ),
    ]
    if any(pad):
        out.append(stage("crop", "the padding cut", MAP, Op(path, ("__getitem__",), -1)))
    if shifted:
        detail = f"roll by ({shift[0]}, {shift[1]}): the map back in place"
        out.append(stage("shift back", detail, MAP, Op(path, ("roll",), -1)))
    return out


def block_stages(root: nn.Module, path: str, block: int, grid: tuple[int, int]) -> list:
    """A `SwinBlock`: x + attention(norm1(x)), then x + mlp(norm2(x)) (V1, pre-norm); V2
    normalises each branch's output instead (res-post-norm)."""
    module: SwinBlock = root.get_submodule(path)
    post = module.res_post_norm
    of = " of the branch" if post else ""

    def norm(name: str, role: str) -> Stage:
        return module_stage(root, f"{path}.{name}", role, f"LayerNorm{of}", MAP, block)

    def residual(branch: str, nth: int) -> Stage:
        return Stage(path, "residual", f"x + {branch}", MAP, Op(path, ("add",), nth), 0, block)

    attn = _window_stages(root, path, block, grid)
    mlp = [
        replace(s, layout=s.layout.replace("N", "H, W").replace("D", "C"), block=block)
        for s in mlp_stages(root, f"{path}.mlp", block)
    ]
    if post:
        attn, mlp = attn + [norm("norm1", "attention norm")], mlp + [norm("norm2", "MLP norm")]
    else:
        attn, mlp = [norm("norm1", "attention norm"), *attn], [norm("norm2", "MLP norm"), *mlp]
    return [*attn, residual("attention", 0), *mlp, residual("MLP", 1)]


def merging_stages(root: nn.Module, path: str) -> list[Stage]:
    """A `PatchMerging`: each 2x2 group of neighbours concatenated, normed and projected (V2:
    projected, then normed)."""
    module: PatchMerging = root.get_submodule(path)
    four, out = module.reduction.in_features, module.reduction.out_features
    concat = Stage(
        path,
        "patch merging",
        "each 2x2 neighbours concatenated (odd sides padded)",
        "(B, H/2, W/2, 4C)",
        Op(path, ("flatten",), -1),
    )
    norm = module_stage(
        root,
        f"{path}.norm",
        "merging norm",
        "LayerNorm",
        "(B, H/2, W/2, 2C)" if module.post_norm else "(B, H/2, W/2, 4C)",
    )
    linear = module_stage(
        root,
        f"{path}.reduction",
        "merging projection",
        f"Linear {four}->{out}, no bias",
        "(B, H/2, W/2, 2C)",
    )
    return [concat, linear, norm] if module.post_norm else [concat, norm, linear]


def _head_stages(model: nn.Module) -> list[Stage]:
    """The final norm, the pooling over the map and the classifier."""
    stages = [module_stage(model, "norm", "final norm", "LayerNorm", MAP)]
    pool = model.head.global_pool
    if pool == "none":
        stages.append(
            Stage(
                "head",
                "pooling",
                "none: the head sees every position",
                MAP,
                Input("head.fc" if model.num_classes else "head"),
            )
        )
    else:
        reduce = {"avg": "mean", "max": "max", "avgmax": "(mean + max) / 2"}[pool]
        measure = Input("head.fc") if model.num_classes else Output("head")
        stages.append(Stage("head", "pooling", f"{reduce} over H, W", "(B, C)", measure))
    if model.num_classes:
        fc = model.head.fc
        detail = f"Linear {fc.in_features}->{fc.out_features}"
        stages.append(module_stage(model, "head.fc", "head", detail, "(B, classes)"))
    return stages


def describe_swin(model: nn.Module, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage;
    blocks are numbered over the whole model, and one whose stages repeat an earlier block's
    (on a smaller map) is folded into one line (`FlowSpec.fold='pattern'`)."""
    grid = model.patch_embed.grid_for(*input_size[-2:])
    detail = "reshape the tokens to the patch grid"
    stages = [
        Stage("input", "image", "", "(B, C, H, W)", Input("")),
        *patch_embed_stages(model, "patch_embed"),
        Stage("patch_embed", "to map", detail, "(B, H/ph, W/pw, D)", Input("layers.0")),
    ]
    block = 0
    for i, layer in enumerate(model.layers):
        if isinstance(layer.downsample, PatchMerging):
            stages += merging_stages(model, f"layers.{i}.downsample")
        for j in range(len(layer.blocks)):
            path = f"layers.{i}.blocks.{j}"
            stages += block_stages(model, path, block, stage_resolution(grid, i))
            block += 1
    version = f"Swin V{model.config.version}"
    return FlowSpec(
        stages=(*stages, *_head_stages(model)),
        encoder=version,
        blocks="layers",
        grid=grid,
        patches=Output("patch_embed"),
        tokens=Output("patch_embed"),
        legend=LEGEND,
        fold="pattern",
    )
