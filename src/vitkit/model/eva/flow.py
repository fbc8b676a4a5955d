"""EVA's forward pass as stages (`Eva.describe_flow`), for `vitkit.summary.flow`: the patch
embedding, the class and register tokens, the absolute positions or the rotary table, each
block (its attention rotating the patch tokens' q and k, LayerScale, the MLP or SwiGLU), the
final norm, the pooling (class token, mean, attention pool) and the head.

RoPE (Su et al., "RoFormer", 2021) adds nothing to the tokens: the model computes one table of
angles per input grid (`rope`) and each block's attention turns q and k by it before their
product (Fang et al., "EVA-02", 2024; Heo et al., "RoPE-ViT", ECCV 2024; Simeoni et al.,
"DINOv3", 2025). Every shape is measured where the model computes it; the shared layers'
describers are `model/stages.py`'s.
"""

from __future__ import annotations

from torch import nn

from ..layers.rope import AxialRope, CenteredRope, MixedRope
from ..stages import (
    FlowSpec,
    Input,
    Op,
    Output,
    Stage,
    biased_qkv_stages,
    closing_stages,
    gamma_stages,
    mlp_stages,
    module_stage,
    opening_stages,
    optional_stages,
    param_count,
    residual_block_stages,
    scores_stages,
)
from .attention import EvaAttention

HEADS = "(B, heads, N, hd)"
LEGEND = (
    "B batch, C channels, H x W image, D width, P patches, N tokens (P + class and register "
    "tokens), hd head width (D / heads), kv key / value heads, hidden the MLP's width (D * "
    "mlp_ratio)"
)
ROPES = {AxialRope: "axial", MixedRope: "mixed", CenteredRope: "centred"}  # layers/rope.py


def _qkv_stages(root: nn.Module, path: str, block: int) -> list[Stage]:
    """EVA's fused weight (read by `F.linear`, its q / v biases beside it) or timm's separate
    q, k, v projections; then the heads."""
    attn: EvaAttention = root.get_submodule(path)
    if attn.qkv is not None:
        return biased_qkv_stages(root, path, block)
    dim = attn.proj.in_features
    projections = (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj))
    stages = [
        module_stage(
            root,
            f"{path}.{name}_proj",
            f"{name} projection",
            f"Linear {dim}->{proj.out_features}",
            "(B, N, D)" if proj.out_features == dim else "(B, N, kv*hd)",
            block,
        )
        for name, proj in projections
    ]
    split = Op(path, ("transpose",), 0)  # q's
    detail = "reshape + transpose: q, k, v each (B, heads, N, hd)"
    return [*stages, Stage(path, "split heads", detail, HEADS, split, 0, block)]


def attention_stages(root: nn.Module, path: str, block: int, rope: bool) -> list[Stage]:
    """An `EvaAttention` on its written-out path: q, k, v, their norms, the rotation of the
    patch tokens' q and k (the last 4-D `cat` joins k's prefix tokens to its rotated patches),
    grouped key / value heads repeated, softmax(q k^T * scale) v, projection."""
    attn: EvaAttention = root.get_submodule(path)
    dim = attn.proj.in_features
    stages = [
        *_qkv_stages(root, path, block),
        *optional_stages(root, f"{path}.q_norm", "query norm", HEADS, block),
        *optional_stages(root, f"{path}.k_norm", "key norm", HEADS, block),
    ]
    if rope:
        detail = "RoPE turns the patches' q and k"  # the prefix tokens' are not
        measure = Op(path, ("cat",), -1, ndim=4)
        stages.append(Stage(path, "rotary positions", detail, HEADS, measure, 0, block))
    groups = attn.num_heads // attn.num_kv_heads
    if groups > 1:
        detail = f"each key / value head serves {groups} query heads"
        measure = Op(path, ("repeat_interleave",), -1)
        stages.append(Stage(path, "kv heads repeated", detail, HEADS, measure, 0, block))
    proj = f"Linear {dim}->{dim}"
    return [
        *stages,
        *scores_stages(path, block),
        *optional_stages(root, f"{path}.norm", "merged heads norm", "(B, N, D)", block),
        module_stage(root, f"{path}.proj", "attention projection", proj, "(B, N, D)", block),
    ]


def block_stages(root: nn.Module, path: str, block: int, rope: bool) -> list[Stage]:
    """An `EvaBlock`: pre-norm with LayerScale `gamma_1`, `gamma_2`, or post-norm (x +
    norm(f(x)), EVA-02-E)."""
    branches = (
        attention_stages(root, f"{path}.attn", block, rope),
        mlp_stages(root, f"{path}.mlp", block),
    )
    post = root.get_submodule(path).post_norm
    return residual_block_stages(root, path, block, branches, gamma_stages(root, path, block), post)


def _rope_stage(model: nn.Module) -> list[Stage]:
    """The rotary table of the input's grid: sin and cos of each patch's angles, no token
    changed here (the blocks' attention turns q and k by it)."""
    if model.rope is None:
        return []
    name = ROPES[type(model.rope)]
    detail = f"{name} RoPE, sin | cos per patch"
    layout = "(depth, heads, P, 2*hd)" if isinstance(model.rope, MixedRope) else "(P, 2*hd)"
    return [Stage("rope", "rotary table", detail, layout, Output("rope"), param_count(model.rope))]


def describe_eva(model: nn.Module, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage."""
    stages = [
        *opening_stages(model, positions_first=model.no_embed_class),
        *_rope_stage(model),
        *optional_stages(model, "norm_pre", "norm before the blocks", "(B, N, D)", None),
    ]
    for i in range(len(model.blocks)):
        stages += block_stages(model, f"blocks.{i}", i, model.rope is not None)
    over = "all tokens" if model.global_pool == "map" else "the patch tokens"
    stages += closing_stages(model, over)
    rope = f", {ROPES[type(model.rope)]} RoPE" if model.rope is not None else ""
    return FlowSpec(
        stages=tuple(stages),
        encoder=f"EVA{rope}",
        blocks="blocks",
        grid=model.patch_embed.grid_for(*input_size[-2:]),
        patches=Output("patch_embed"),
        tokens=Input("blocks.0"),
        legend=LEGEND,
    )
