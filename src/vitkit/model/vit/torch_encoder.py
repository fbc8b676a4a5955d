"""The same encoder built from `torch.nn.TransformerEncoderLayer`.

`VisionTransformer(..., encoder='torch')` uses it. With `norm_first=True`, GELU, eps 1e-6 and
`batch_first=True`, a `TransformerEncoderLayer` is the paper's pre-norm block: the same layers,
the same parameter count. `native_to_torch_state_dict` / `torch_to_native_state_dict` rename the
weights between the two, so both backends compute the same function.

What PyTorch's layer cannot express, and is therefore refused for `encoder='torch'`:
- separate attention-weight and projection dropout rates: one `dropout` drives the attention
  weights, the output projection and both MLP dropouts (`attn_drop_rate` must equal `drop_rate`);
- stochastic depth (`drop_path_rate`), LayerScale (`init_values`) and a custom `qk_scale`;
- a qkv projection without bias: its `bias` switch covers every Linear and LayerNorm at once.
What it matches: no dropout after the qkv projection (Appendix B.1), dropout after every other
dense layer, exact-erf GELU, pre-norm with residuals, and the 1/sqrt(head_dim) scale.
"""

from __future__ import annotations

import re
from dataclasses import replace

from torch import Tensor, nn

from ..stages import TOKEN, Op, Output, Stage, module_stage, param_count

# (native block suffix, torch layer suffix); qkv.* maps onto MHA's packed in-projection.
_RENAMES = (
    ("norm1.weight", "norm1.weight"),
    ("norm1.bias", "norm1.bias"),
    ("attn.qkv.weight", "self_attn.in_proj_weight"),
    ("attn.qkv.bias", "self_attn.in_proj_bias"),
    ("attn.proj.weight", "self_attn.out_proj.weight"),
    ("attn.proj.bias", "self_attn.out_proj.bias"),
    ("norm2.weight", "norm2.weight"),
    ("norm2.bias", "norm2.bias"),
    ("mlp.fc1.weight", "linear1.weight"),
    ("mlp.fc1.bias", "linear1.bias"),
    ("mlp.fc2.weight", "linear2.weight"),
    ("mlp.fc2.bias", "linear2.bias"),
)


def check_torch_encoder_options(
    *,
    attn_drop_rate: float,
    drop_rate: float,
    drop_path_rate: float,
    init_values: float | None,
    qk_scale: float | None,
    qkv_bias: bool,
) -> None:
    """Refuse, with the reason, options `nn.TransformerEncoderLayer` cannot express."""
    problems = []
    if attn_drop_rate != drop_rate:
        problems.append("attn_drop_rate must equal drop_rate (one dropout rate drives both)")
    if drop_path_rate:
        problems.append("drop_path_rate must be 0 (no stochastic depth)")
    if init_values:
        problems.append("init_values must be None (no LayerScale)")
    if qk_scale is not None:
        problems.append("qk_scale must be None (the scale is fixed at head_dim ** -0.5)")
    if not qkv_bias:
        problems.append("qkv_bias must be True (its bias switch covers every layer)")
    if problems:
        raise ValueError(
            "encoder='torch' cannot express these options: "
            + "; ".join(problems)
            + ". Use encoder='native' for them."
        )


def build_torch_encoder(
    *, dim: int, depth: int, num_heads: int, mlp_ratio: float, dropout: float, norm_eps: float
) -> nn.TransformerEncoder:
    """`depth` pre-norm `TransformerEncoderLayer`s, without a final norm (the model adds it)."""
    layer = nn.TransformerEncoderLayer(
        d_model=dim,
        nhead=num_heads,
        dim_feedforward=int(dim * mlp_ratio),
        dropout=dropout,
        activation="gelu",
        layer_norm_eps=norm_eps,
        batch_first=True,
        norm_first=True,
    )
    return nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)


def _rename(state_dict: dict[str, Tensor], pattern: str, template: str, pairs) -> dict[str, Tensor]:
    out = {}
    regex = re.compile(pattern)
    for key, value in state_dict.items():
        match = regex.fullmatch(key)
        if match is None:
            out[key] = value
            continue
        index, suffix = match.group(1), match.group(2)
        renamed = dict(pairs).get(suffix)
        if renamed is None:
            raise KeyError(f"no counterpart for encoder weight {key!r}")
        out[template.format(index, renamed)] = value
    return out


def native_to_torch_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename `blocks.N.attn.qkv.weight`-style keys to `blocks.layers.N.self_attn...` keys."""
    return _rename(state_dict, r"blocks\.(\d+)\.(.+)", "blocks.layers.{}.{}", _RENAMES)


def torch_to_native_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `native_to_torch_state_dict`."""
    pairs = [(theirs, ours) for ours, theirs in _RENAMES]
    return _rename(state_dict, r"blocks\.layers\.(\d+)\.(.+)", "blocks.{}.{}", pairs)


def torch_layer_stages(root: nn.Module, path: str, block: int) -> list[Stage]:
    """An `nn.TransformerEncoderLayer` (norm_first) as stages for `vitkit.summary.flow`: the
    native block's steps, with the attention inside `nn.MultiheadAttention`, which works
    sequence-first and folds the heads into the batch (its aten operators are measured)."""
    layer = root.get_submodule(path)
    dim, hidden = layer.self_attn.embed_dim, layer.linear1.out_features
    mlp_out = f"Linear {hidden}->{dim}"
    return [
        module_stage(root, f"{path}.norm1", "attention norm", "LayerNorm", TOKEN, block),
        *_mha_stages(layer.self_attn, f"{path}.self_attn", block),
        Stage(path, "residual", "x + attention", TOKEN, Op(path, ("add",), 0), 0, block),
        module_stage(root, f"{path}.norm2", "MLP norm", "LayerNorm", TOKEN, block),
        Stage(
            f"{path}.linear1",
            "MLP hidden",
            f"Linear {dim}->{hidden} + GELU",
            "(B, N, hidden)",
            Op(path, ("gelu",)),
            param_count(layer.linear1),
            block,
        ),
        module_stage(root, f"{path}.linear2", "MLP output", mlp_out, TOKEN, block),
        Stage(path, "residual", "x + MLP", TOKEN, Op(path, ("add",), 1), 0, block),
    ]


def _mha_stages(mha: nn.MultiheadAttention, attn: str, block: int) -> list[Stage]:
    """`nn.MultiheadAttention` at `attn`, step by step: sequence first, the packed qkv
    projection, the heads folded into the batch, the two batched products around the softmax,
    the heads merged, the output projection, batch first again."""
    dim = mha.embed_dim
    # aten splits a Linear into mm (+ add) or addmm, depending on the input's memory layout;
    # the merged heads are the product's second-to-last input either way.
    first, last = Op(attn, ("mm", "addmm"), 0, aten=True), Op(attn, ("mm", "addmm"), -1, aten=True)
    bmm = (Op(attn, ("bmm",), 0, aten=True), Op(attn, ("bmm",), 1, aten=True))

    def step(role: str, detail: str, layout: str, measure: Op | Output) -> Stage:
        return Stage(attn, role, detail, layout, measure, 0, block)

    in_proj = f"packed Linear {dim}->{3 * dim} on N*B rows"
    in_params = mha.in_proj_weight.numel() + mha.in_proj_bias.numel()
    out_proj = f"Linear {dim}->{dim} (called as F.linear)"
    heads = "(B*heads, N, hd)"
    return [
        step("sequence first", "transpose(0, 1)", "(N, B, D)", Op(attn, ("transpose",))),
        Stage(f"{attn}.in_proj", "qkv projection", in_proj, "(N*B, 3*D)", first, in_params, block),
        step(
            "split q, k, v",
            "unflatten + transpose",
            "(3, N, B, D)",
            Op(attn, ("clone",), aten=True, ndim=4),
        ),
        step(
            "split heads", "view + transpose: heads into the batch", heads, replace(bmm[0], arg=0)
        ),
        step("attention logits", "bmm(q * scale, k^T)", "(B*heads, N, N)", bmm[0]),
        step(
            "softmax",
            "over the keys: each row sums to 1",
            "(B*heads, N, N)",
            Op(attn, ("_softmax",), aten=True),
        ),
        step("weighted values", "bmm(softmax, v)", heads, bmm[1]),
        step("merge heads", "transpose + view", "(N*B, D)", replace(last, arg=-2)),
        Stage(
            f"{attn}.out_proj",
            "attention projection",
            out_proj,
            "(N*B, D)",
            last,
            param_count(mha.out_proj),
            block,
        ),
        step("batch first", "view + transpose(0, 1)", TOKEN, Output(attn)),
    ]
