"""BEiT's forward pass as stages (`Beit.describe_flow`), for `vitkit.summary.flow`: the patch
embedding, the class token, the absolute positions where the model has them, the shared
relative position bias, each block (q / v biases, the relative position bias added to the
logits, LayerScale `gamma_1` / `gamma_2`, the MLP), the final norm or the mean pooling with
`fc_norm`, and the head.

Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022), Section 2.2 and
Appendix; the table of one bias per head and offset, plus three rows for the class token, is
`layers/rel_pos_bias.py`. Every shape is measured where the model computes it; the shared
layers' describers are `model/stages.py`'s.
"""

from __future__ import annotations

from torch import nn

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
    param_count,
    residual_block_stages,
    scores_stages,
)
from .attention import BeitAttention

LEGEND = (
    "B batch, C channels, H x W image, D width, P patches, N tokens (P + the class token), hd "
    "head width (D / heads), hidden the MLP's width (D * mlp_ratio)"
)


def _bias_stages(root: nn.Module, path: str, block: int, shared: bool) -> list[Stage]:
    """The relative position bias of the block's table (and / or the shared one's), (1,
    heads, N, N), and its sum with the logits (the attention's last `add`)."""
    attn: BeitAttention = root.get_submodule(path)
    table = attn.relative_position_bias_table
    if table is None and not shared:
        return []
    detail = "the shared bias" if table is None else f"table ({table.shape[0]}, heads) at offsets"
    detail += " + the shared bias" if shared and table is not None else ""
    bias, added = Op(path, ("unsqueeze",)), Op(path, ("add",), -1)
    return [
        Stage(path, "position bias", detail, "(1, heads, N, N)", bias, param_count(table), block),
        Stage(path, "bias added", "logits + position bias", "(B, heads, N, N)", added, 0, block),
    ]


def attention_stages(root: nn.Module, path: str, block: int, shared: bool) -> list[Stage]:
    """A `BeitAttention` on its written-out path: the qkv weight read by `F.linear` with the
    q / v biases, heads, logits plus the relative position bias, softmax, values, projection."""
    dim = root.get_submodule(path).proj.in_features
    proj = f"Linear {dim}->{dim}"
    return [
        *biased_qkv_stages(root, path, block),
        *scores_stages(path, block, _bias_stages(root, path, block, shared)),
        module_stage(root, f"{path}.proj", "attention projection", proj, "(B, N, D)", block),
    ]


def block_stages(root: nn.Module, path: str, block: int, shared: bool) -> list[Stage]:
    """A `BeitBlock`: x + gamma_1 * attention(norm1(x)), then x + gamma_2 * mlp(norm2(x))."""
    branches = (
        attention_stages(root, f"{path}.attn", block, shared),
        mlp_stages(root, f"{path}.mlp", block),
    )
    return residual_block_stages(root, path, block, branches, gamma_stages(root, path, block))


def describe_beit(model: nn.Module, input_size: tuple[int, ...]) -> FlowSpec:
    """`model`'s forward pass for an input of `input_size` (B, C, H, W), stage by stage."""
    shared = model.rel_pos_bias is not None
    stages = opening_stages(model)
    if shared:
        table = model.rel_pos_bias.relative_position_bias_table
        detail = f"({table.shape[0]}, heads) for all blocks"
        stages.append(
            module_stage(model, "rel_pos_bias", "shared position bias", detail, "(heads, N, N)")
        )
    for i in range(len(model.blocks)):
        stages += block_stages(model, f"blocks.{i}", i, shared)
    stages += closing_stages(model, "the patch tokens")
    return FlowSpec(
        stages=tuple(stages),
        encoder="BEiT",
        blocks="blocks",
        grid=model.patch_embed.grid_for(*input_size[-2:]),
        patches=Output("patch_embed"),
        tokens=Input("blocks.0"),
        legend=LEGEND,
    )
