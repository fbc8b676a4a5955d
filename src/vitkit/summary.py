"""A per-layer table of a model: output shape, parameters and FLOPs, with totals.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode` (see `flop_counter`): a
multiply-add counts as 2, and matrix products, convolutions and attention are counted
(elementwise ops, norms and activations are not, as is usual for such tables).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flops(
    grad_shape, query_shape, key_shape, value_shape, *args, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)


def flop_counter(display: bool = False) -> FlopCounterMode:
    """PyTorch's `FlopCounterMode`, also counting the CPU attention kernels (forward and
    backward), which it has no formula for: the one FLOP count used by summary and benchmarks."""
    aten = torch.ops.aten
    return FlopCounterMode(
        display=display,
        custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
        },
    )


@dataclass
class LayerRow:
    name: str
    kind: str
    depth: int
    output_shape: tuple[int, ...] | None
    params: int
    flops: int


@dataclass
class ModelSummary:
    """What `summary` measured; `str()` renders the table."""

    input_size: tuple[int, ...]
    rows: list[LayerRow] = field(default_factory=list)
    total_params: int = 0
    trainable_params: int = 0
    total_flops: int = 0

    def __str__(self) -> str:
        header = ("Layer (type)", "Output shape", "Params", "FLOPs")
        lines = [
            (
                "  " * row.depth + f"{row.name} ({row.kind})",
                "x".join(str(d) for d in row.output_shape) if row.output_shape else "-",
                f"{row.params:,}",
                _human(row.flops) if row.flops else "-",
            )
            for row in self.rows
        ]
        widths = [max(len(r[i]) for r in [header, *lines]) for i in range(4)]
        rule = "-" * (sum(widths) + 6)

        def fmt(r: tuple[str, ...]) -> str:
            cells = [f"{r[0]:<{widths[0]}}"] + [f"{c:>{w}}" for c, w in zip(r[1:], widths[1:])]
            return "  ".join(cells)

        out = [rule, fmt(header), rule, *(fmt(r) for r in lines), rule]
        out += [
            f"Input size: {'x'.join(str(d) for d in self.input_size)}",
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Non-trainable params: {self.total_params - self.trainable_params:,}",
            f"Total FLOPs: {_human(self.total_flops)} ({self.total_flops:,})",
            rule,
        ]
        return "\n".join(out)


def _human(flops: int) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return str(flops)


def _first_tensor(output: object) -> Tensor | None:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def summary(model: nn.Module, input_size: tuple[int, ...], max_depth: int = 3) -> ModelSummary:
    """Run one batch of zeros through `model` and tabulate every layer.

    Args:
        model: any module; its training flag is restored afterwards.
        input_size: (B, C, H, W), or (C, H, W) for batch 1.
        max_depth: deepest module level listed (the totals always cover everything).
    """
    if len(input_size) == 3:
        input_size = (1, *input_size)
    shapes: dict[str, tuple[int, ...]] = {}
    order: list[str] = []
    names = {module: name for name, module in model.named_modules()}

    def enter(module: nn.Module, _inputs: object) -> None:
        if names[module] not in order:  # call order, parents before children
            order.append(names[module])

    def leave(module: nn.Module, _inputs: object, output: object) -> None:
        tensor = _first_tensor(output)
        shapes[names[module]] = tuple(tensor.shape) if tensor is not None else None

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    was_training = model.training
    model.eval()
    counter = flop_counter()
    try:
        # Grad stays on so fused inference fast paths (which hide sub-layers) are not taken.
        with torch.enable_grad(), counter:
            model(torch.zeros(input_size, device=device, dtype=dtype))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)

    flop_counts = counter.get_flop_counts()
    root = type(model).__name__

    def flops_of(name: str) -> int:
        key = root if not name else f"{root}.{name}"
        return int(sum(flop_counts.get(key, {}).values()))

    modules = dict(model.named_modules())
    result = ModelSummary(input_size=tuple(input_size))
    for name in order:
        depth = 0 if not name else name.count(".") + 1
        if depth > max_depth:
            continue
        module = modules[name]
        if isinstance(module, nn.Identity):
            continue
        result.rows.append(
            LayerRow(
                name=name or root,
                kind=type(module).__name__,
                depth=depth,
                output_shape=shapes[name],
                params=sum(p.numel() for p in module.parameters()),
                flops=flops_of(name),
            )
        )
    result.total_params = sum(p.numel() for p in model.parameters())
    result.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result.total_flops = int(sum(flop_counts.get("Global", {}).values()))
    return result


# -- the stage-by-stage walk ----------------------------------------------------------------

LEGEND = (
    "B batch, C channels, H x W image, D width, P patches, N tokens (P + prefix tokens), "
    "hd head width (D / heads)"
)
_BLOCK = re.compile(r"^blocks\.(?:layers\.)?(\d+)")


@dataclass(frozen=True)
class FlowRow:
    """One stage of the forward pass: the module (or model attribute) that runs it, what it
    does, the layout and the measured shape of its output, and the parameters it owns (None:
    another view of the stage above, which owns them)."""

    stage: str
    role: str
    detail: str
    layout: str
    shape: tuple[int, ...]
    params: int | None = 0
    block: int | None = None

    @property
    def operation(self) -> str:
        return f"{self.role}: {self.detail}" if self.detail else self.role


@dataclass
class ModelFlow:
    """What `flow` measured; `render()` (or `str()`) is the table, one line per stage."""

    input_size: tuple[int, ...]
    encoder: str
    rows: list[FlowRow]
    total_params: int
    patches: int
    grid: tuple[int, int]
    tokens: int

    def blocks(self) -> dict[int, list[FlowRow]]:
        out: dict[int, list[FlowRow]] = {}
        for row in self.rows:
            if row.block is not None:
                out.setdefault(row.block, []).append(row)
        return out

    def blocks_alike(self) -> bool:
        """Whether every block has block 0's stages, shapes and parameter counts (measured,
        so a model whose blocks differ is always shown in full)."""

        def key(rows: list[FlowRow]) -> list[tuple]:
            return [
                (_BLOCK.sub("blocks.#", r.stage), r.operation, r.layout, r.shape, r.params)
                for r in rows
            ]

        blocks = list(self.blocks().values())
        return all(key(rows) == key(blocks[0]) for rows in blocks[1:])

    def shown_rows(self, all_blocks: bool = False) -> list[FlowRow]:
        """The rows of the table: blocks after the first folded into one line when they all
        repeat block 0 (`all_blocks` lists every one)."""
        blocks = self.blocks()
        if all_blocks or len(blocks) < 2 or not self.blocks_alike():
            return list(self.rows)
        rest = [row for i, rows in blocks.items() if i > 0 for row in rows]
        last = max(blocks)
        prefix = "blocks.layers" if self.encoder == "torch" else "blocks"
        folded = FlowRow(
            stage=f"{prefix}.1-{last}" if last > 1 else f"{prefix}.1",
            role=f"{last} more blocks" if last > 1 else "1 more block",
            detail="each exactly as block 0",
            layout="(B, N, D)",
            shape=blocks[last][-1].shape,
            params=sum(row.params or 0 for row in rest),
        )
        out: list[FlowRow] = []
        for row in self.rows:
            if row.block is None or row.block == 0:
                out.append(row)
            if row.block == 0 and row is blocks[0][-1]:
                out.append(folded)
        return out

    def render(self, all_blocks: bool = False) -> str:
        header = ("Stage", "Operation", "Layout", "Output shape", "Params")
        lines = [
            (
                r.stage,
                r.operation,
                r.layout,
                _shape(r.shape),
                "-" if r.params is None else f"{r.params:,}",
            )
            for r in self.shown_rows(all_blocks)
        ]
        body = _table(header, lines, right=(4,))
        rule = body[0]
        gh, gw = self.grid
        return "\n".join(
            [
                *body,
                f"Input: {_shape(self.input_size)}; {gh}x{gw} grid = {self.patches} patches, "
                f"{self.tokens} tokens; encoder: {self.encoder}",
                f"Total params: {self.total_params:,} ({_millions(self.total_params)})",
                f"Layout: {LEGEND}",
                rule,
            ]
        )

    def __str__(self) -> str:
        return self.render()


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _millions(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def _table(
    header: tuple[str, ...], lines: list[tuple[str, ...]], right: tuple[int, ...]
) -> list[str]:
    """Rows padded to their columns, between rules; columns in `right` right-aligned."""
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def fmt(r: tuple[str, ...]) -> str:
        cells = [
            f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(r, widths))
        ]
        return "  ".join(cells).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return [rule, fmt(header), rule, *(fmt(r) for r in lines), rule]


@dataclass
class _Event:
    scope: str
    name: str
    shape: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]


def _tensor_shapes(values: Sequence[object]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(v.shape) for v in values if isinstance(v, Tensor))


class _FunctionRecorder(TorchFunctionMode):
    """Every torch function the forward pass calls, with the module it runs in."""

    def __init__(self, scopes: list[str]) -> None:
        super().__init__()
        self.scopes = scopes
        self.events: list[_Event] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensor = _first_tensor(out)
        if tensor is not None:
            name = getattr(func, "__name__", str(func))
            self.events.append(_Event(self.scopes[-1], name, tuple(tensor.shape), ()))
        return out


class _AtenRecorder(TorchDispatchMode):
    """The aten operators below the functions: what runs inside `nn.MultiheadAttention`,
    whose whole computation is one function (`F.multi_head_attention_forward`)."""

    def __init__(self, scopes: list[str]) -> None:
        super().__init__()
        self.scopes = scopes
        self.events: list[_Event] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensor = _first_tensor(out)
        if tensor is not None:
            name = func.overloadpacket.__name__
            self.events.append(
                _Event(self.scopes[-1], name, tuple(tensor.shape), _tensor_shapes(args))
            )
        return out


@dataclass
class _Trace:
    """What one forward pass recorded: ops per module scope, each module's input and output
    shapes (first call), and the patch projection's input (for the unfold view)."""

    functions: dict[str, list[_Event]] = field(default_factory=dict)
    aten: dict[str, list[_Event]] = field(default_factory=dict)
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    proj_input: Tensor | None = None
    proj_output: Tensor | None = None

    def pick(
        self,
        scope: str,
        names: str | tuple[str, ...],
        nth: int = 0,
        *,
        aten: bool = False,
        ndim: int | None = None,
    ) -> _Event:
        """The `nth` op named one of `names` (of `ndim` dimensions) run directly in `scope`."""
        names = (names,) if isinstance(names, str) else names
        found = [
            event
            for event in (self.aten if aten else self.functions).get(scope, [])
            if event.name in names and (ndim is None or len(event.shape) == ndim)
        ]
        if not -len(found) <= nth < len(found):
            raise RuntimeError(
                f"the walk found no {' or '.join(names)} #{nth} in {scope or 'the model'}; "
                "summary.flow does not know this layer's forward: use summary() for the "
                "module table"
            )
        return found[nth]


def _run_traced(model: nn.Module, x: Tensor) -> _Trace:
    trace = _Trace()
    scopes = [""]
    names = {module: name for name, module in model.named_modules()}
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)

    def enter(module: nn.Module, args: tuple) -> None:
        name = names[module]
        scopes.append(name)
        tensor = _first_tensor(args)
        if tensor is not None:
            trace.inputs.setdefault(name, tuple(tensor.shape))
        if module is proj and trace.proj_input is None:
            trace.proj_input = args[0].detach()

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        scopes.pop()
        tensor = _first_tensor(output)
        if tensor is not None:
            trace.outputs.setdefault(names[module], tuple(tensor.shape))
        if module is proj and trace.proj_output is None:
            trace.proj_output = tensor.detach()

    def attention_weights(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        # nn.TransformerEncoderLayer asks for no weights, which takes the fused kernel; asking
        # for them runs the explicit products, so their shapes can be seen (same outputs).
        return args, {**kwargs, "need_weights": True, "average_attn_weights": False}

    hooks = []
    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(enter))
        hooks.append(module.register_forward_hook(leave))
        if isinstance(module, nn.MultiheadAttention):
            hooks.append(module.register_forward_pre_hook(attention_weights, with_kwargs=True))
    functions, aten = _FunctionRecorder(scopes), _AtenRecorder(scopes)
    try:
        # Grad on, as in `summary`: no fused inference path hides a sub-layer.
        with torch.enable_grad(), functions, aten:
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    for target, events in ((trace.functions, functions.events), (trace.aten, aten.events)):
        for event in events:
            target.setdefault(event.scope, []).append(event)
    return trace


def _params(*tensors: Tensor | None) -> int:
    return sum(t.numel() for t in tensors if isinstance(t, nn.Parameter))


def _module_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@contextlib.contextmanager
def _explicit_attention(model: nn.Module) -> Iterator[None]:
    """The model with its attention computed as softmax(q k^T) v (each `fused_attn` flag off)
    in eval mode for the walk, restored afterwards with its training flag. The CPU fast path
    needs nothing: grad stays on in the walk, and its layers then run their plain function."""
    fused = {
        m: m.fused_attn for m in model.modules() if isinstance(getattr(m, "fused_attn", None), bool)
    }
    for module in fused:
        module.fused_attn = False
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
        for module, value in fused.items():
            module.fused_attn = value


def flow(model: nn.Module, input_size: tuple[int, ...]) -> ModelFlow:
    """The forward pass of a vitkit `VisionTransformer`, stage by stage: one batch of zeros
    runs through the model (explicit attention, grad on) while every torch function (and, inside
    `nn.MultiheadAttention`, every aten operator) is recorded with the module it runs in, so
    each shape is the one the model produced, for any option and either encoder.

    Args:
        model: a `VisionTransformer` (native blocks or `encoder='torch'`); its attention
            kernel choice and training flag are restored afterwards.
        input_size: (B, C, H, W), or (C, H, W) for batch 1.
    """
    if not all(hasattr(model, name) for name in ("patch_embed", "blocks", "config", "head")):
        raise TypeError(
            f"flow walks a vitkit VisionTransformer, not {type(model).__name__}; use summary() "
            "for any module"
        )
    if len(input_size) == 3:
        input_size = (1, *input_size)
    param = next(model.parameters())
    x = torch.zeros(input_size, device=param.device, dtype=param.dtype)
    with _explicit_attention(model):
        trace = _run_traced(model, x)
        rows = _walk(model, trace, x)
    patches = trace.outputs["patch_embed"][1]
    grid = model.patch_embed.grid_for(*input_size[-2:])
    tokens = trace.inputs["blocks"][1]
    return ModelFlow(
        input_size=tuple(input_size),
        encoder=model.config.encoder,
        rows=rows,
        total_params=_module_params(model),
        patches=patches,
        grid=grid,
        tokens=tokens,
    )


def _walk(model: nn.Module, trace: _Trace, x: Tensor) -> list[FlowRow]:
    def module_row(
        name: str, role: str, detail: str, layout: str, block: int | None = None
    ) -> FlowRow:
        module = model.get_submodule(name)
        return FlowRow(
            name, role, detail, layout, trace.outputs[name], _module_params(module), block
        )

    rows = [FlowRow("input", "image", "", "(B, C, H, W)", tuple(x.shape))]
    rows += _patch_rows(model, trace, module_row)
    tokens = {
        "cls_token": ("class", model.cls_token),
        "dist_token": ("distillation", model.dist_token),
        "reg_token": ("register", getattr(model, "reg_token", None)),
    }
    prefix = [(n, t) for n, (_, t) in tokens.items() if t is not None]
    if prefix:
        kinds = [tokens[n][0] for n, _ in prefix]
        label = " and ".join(kinds) + (" token" if kinds == ["class"] else " tokens")
        rows.append(
            FlowRow(
                " + ".join(n for n, _ in prefix),
                "token concat",
                f"prepend the {label} to the patches",
                "(B, N, D)",
                trace.pick("", "cat").shape,
                _params(*(t for _, t in prefix)),
            )
        )
    if model.pos_embed is not None:
        learned = isinstance(model.pos_embed, nn.Parameter)
        kind = "learned table" if learned else f"fixed {model.config.pos_embed} table (not trained)"
        rows.append(
            FlowRow(
                "pos_embed",
                "position add",
                f"x + {kind} (1, N, D)",
                "(B, N, D)",
                trace.inputs["pos_drop"],
                _params(model.pos_embed),
            )
        )
    if isinstance(model.blocks, nn.TransformerEncoder):
        for i in range(len(model.blocks.layers)):
            rows += _torch_layer_rows(model, trace, f"blocks.layers.{i}", i, module_row)
    else:
        for i in range(len(model.blocks)):
            rows += _block_rows(model, trace, f"blocks.{i}", i, module_row)
    if not isinstance(model.norm, nn.Identity):
        rows.append(module_row("norm", "final norm", "LayerNorm", "(B, N, D)"))
    rows.append(_pool_row(model, trace))
    if not isinstance(model.fc_norm, nn.Identity):
        rows.append(module_row("fc_norm", "norm after pooling", "LayerNorm", "(B, D)"))
    for name, role in (("head", "head"), ("head_dist", "distillation head")):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            detail = f"Linear {head.in_features}->{head.out_features}"
            rows.append(module_row(name, role, detail, "(B, classes)"))
    if isinstance(getattr(model, "head_dist", None), nn.Linear):
        rows.append(
            FlowRow(
                "", "average", "(head + head_dist) / 2", "(B, classes)", trace.pick("", "div").shape
            )
        )
    return rows


def _pool_row(model: nn.Module, trace: _Trace) -> FlowRow:
    """What `VisionTransformer.pool` does with the tokens: the class token, a mean / max over
    the patch tokens (or all tokens), the attention-pool head, or nothing."""
    pool, shape = model.global_pool, trace.inputs["fc_norm"]
    if pool == "token":
        return FlowRow("pool", "pooling", "class token x[:, 0]", "(B, D)", shape)
    if pool == "none":
        return FlowRow("pool", "pooling", "none: every token goes on", "(B, N, D)", shape)
    over = "all tokens" if model.pool_include_prefix else "the patch tokens"
    if pool == "map":
        detail = f"attention pool (attn_pool): a learned query attends over {over}"
        return FlowRow(
            "attn_pool", "pooling", detail, "(B, D)", shape, _module_params(model.attn_pool)
        )
    reduce = {"avg": "mean", "max": "max", "avgmax": "(mean + max) / 2"}[pool]
    return FlowRow("pool", "pooling", f"{reduce} of {over}", "(B, D)", shape)


def _patch_rows(model: nn.Module, trace: _Trace, module_row) -> list[FlowRow]:
    embed = model.patch_embed
    ph, pw = embed.patch_size
    rows = []
    if embed.backbone is not None:
        for name, child in embed.backbone.named_children():
            path = f"patch_embed.backbone.{name}"
            if isinstance(child, nn.Conv2d):
                detail = f"Conv2d {child.in_channels}->{child.out_channels}, 3x3, stride 2"
            else:
                detail = type(child).__name__
            rows.append(module_row(path, "conv stem", detail, "(B, C', H', W')"))
    chans = trace.proj_input.shape[1]
    if embed.unfold is None:
        proj = embed.proj
        detail = f"Conv2d {chans}->{proj.out_channels}, kernel {ph}x{pw}, stride {ph}x{pw}"
        rows.append(module_row("patch_embed.proj", "patch embedding", detail, "(B, D, H/ph, W/pw)"))
        # The same function as unfold + linear: computed here, and checked equal to the conv.
        patches = F.unfold(
            trace.proj_input, kernel_size=(ph, pw), stride=(ph, pw)
        )  # (B, C*ph*pw, P)
        weight = proj.weight.detach().reshape(proj.out_channels, -1)  # (D, C*ph*pw)
        bias = proj.bias.detach() if proj.bias is not None else None
        tokens = F.linear(patches.transpose(1, 2), weight, bias)  # (B, P, D)
        conv = trace.proj_output.flatten(2).transpose(1, 2)  # (B, P, D)
        if not torch.allclose(tokens, conv, rtol=1e-4, atol=1e-5):
            raise RuntimeError("the unfold + linear view differs from the patch convolution")
        unfold_detail = f"nn.Unfold cuts {ph}x{pw} patches, each flattened"
        rows.append(
            FlowRow(
                "  = unfold",
                "same as",
                unfold_detail,
                "(B, C*ph*pw, P)",
                tuple(patches.shape),
                None,
            )
        )
        linear_detail = f"Linear {weight.shape[1]}->{weight.shape[0]} (the conv weight reshaped)"
        rows.append(
            FlowRow("  = linear", "then", linear_detail, "(B, P, D)", tuple(tokens.shape), None)
        )
        flat = trace.pick("patch_embed", "transpose").shape
        rows.append(
            FlowRow("patch_embed", "flatten", "flatten(2).transpose(1, 2)", "(B, P, D)", flat)
        )
    else:
        detail = f"nn.Unfold cuts {ph}x{pw} patches, each flattened"
        rows.append(module_row("patch_embed.unfold", "patch embedding", detail, "(B, C*ph*pw, P)"))
        flat = trace.inputs["patch_embed.proj"]
        rows.append(
            FlowRow(
                "patch_embed",
                "flatten",
                "transpose(1, 2): one row per patch",
                "(B, P, C*ph*pw)",
                flat,
            )
        )
        proj = embed.proj
        detail = f"Linear {proj.in_features}->{proj.out_features}"
        rows.append(module_row("patch_embed.proj", "patch projection", detail, "(B, P, D)"))
    if not isinstance(embed.norm, nn.Identity):
        rows.append(module_row("patch_embed.norm", "patch norm", "LayerNorm", "(B, P, D)"))
    return rows


def _block_rows(model: nn.Module, trace: _Trace, path: str, i: int, module_row) -> list[FlowRow]:
    """A native pre-norm block: x + proj(attention(norm1(x))), then x + mlp(norm2(x))."""
    block = model.get_submodule(path)
    dim, hidden = block.attn.qkv.in_features, block.mlp.fc1.out_features
    attn = f"{path}.attn"

    def op(
        role: str, detail: str, layout: str, name: str, nth: int = 0, scope: str = attn
    ) -> FlowRow:
        return FlowRow(scope, role, detail, layout, trace.pick(scope, name, nth).shape, 0, i)

    def scale_row(name: str) -> list[FlowRow]:
        if isinstance(getattr(block, name), nn.Identity):
            return []
        return [module_row(f"{path}.{name}", "layer scale", "x * gamma", "(B, N, D)", i)]

    return [
        module_row(f"{path}.norm1", "attention norm", "LayerNorm", "(B, N, D)", i),
        module_row(f"{attn}.qkv", "qkv projection", f"Linear {dim}->{3 * dim}", "(B, N, 3*D)", i),
        op("split heads", "reshape + permute into q, k, v", "(3, B, heads, N, hd)", "permute"),
        op("attention logits", "q @ k^T * scale", "(B, heads, N, N)", "matmul", 0),
        op("softmax", "over the keys: each row sums to 1", "(B, heads, N, N)", "softmax"),
        op("weighted values", "softmax @ v", "(B, heads, N, hd)", "matmul", 1),
        op("merge heads", "transpose(1, 2) + flatten", "(B, N, D)", "flatten"),
        module_row(f"{attn}.proj", "attention projection", f"Linear {dim}->{dim}", "(B, N, D)", i),
        *scale_row("ls1"),
        op("residual", "x + attention", "(B, N, D)", "add", 0, scope=path),
        module_row(f"{path}.norm2", "MLP norm", "LayerNorm", "(B, N, D)", i),
        FlowRow(
            f"{path}.mlp.fc1",
            "MLP hidden",
            f"Linear {dim}->{hidden} + GELU",
            "(B, N, hidden)",
            trace.outputs[f"{path}.mlp.act"],
            _module_params(block.mlp.fc1),
            i,
        ),
        module_row(f"{path}.mlp.fc2", "MLP output", f"Linear {hidden}->{dim}", "(B, N, D)", i),
        *scale_row("ls2"),
        op("residual", "x + MLP", "(B, N, D)", "add", 1, scope=path),
    ]


def _torch_layer_rows(
    model: nn.Module, trace: _Trace, path: str, i: int, module_row
) -> list[FlowRow]:
    """An `nn.TransformerEncoderLayer` (norm_first): the same block, with the attention inside
    `nn.MultiheadAttention`, which works sequence-first and folds the heads into the batch."""
    layer = model.get_submodule(path)
    mha = layer.self_attn
    dim, hidden = mha.embed_dim, layer.linear1.out_features
    attn = f"{path}.self_attn"
    # aten splits a Linear into mm (+ add) or addmm, depending on the input's memory layout.
    products = ("mm", "addmm")
    in_proj = trace.pick(attn, products, 0, aten=True)
    out_proj = trace.pick(attn, products, -1, aten=True)
    merged = out_proj.inputs[1 if out_proj.name == "addmm" else 0]
    logits, values = trace.pick(attn, "bmm", 0, aten=True), trace.pick(attn, "bmm", 1, aten=True)

    def row(
        role: str, detail: str, layout: str, shape: tuple[int, ...], params: int = 0
    ) -> FlowRow:
        return FlowRow(attn, role, detail, layout, shape, params, i)

    return [
        module_row(f"{path}.norm1", "attention norm", "LayerNorm", "(B, N, D)", i),
        row("sequence first", "transpose(0, 1)", "(N, B, D)", trace.pick(attn, "transpose").shape),
        FlowRow(
            f"{attn}.in_proj",
            "qkv projection",
            f"packed Linear {dim}->{3 * dim} on N*B rows",
            "(N*B, 3*D)",
            in_proj.shape,
            _params(mha.in_proj_weight, mha.in_proj_bias),
            i,
        ),
        row(
            "split q, k, v",
            "unflatten + transpose",
            "(3, N, B, D)",
            trace.pick(attn, "clone", aten=True, ndim=4).shape,
        ),
        row(
            "split heads",
            "view + transpose: heads into the batch",
            "(B*heads, N, hd)",
            logits.inputs[0],
        ),
        row("attention logits", "bmm(q * scale, k^T)", "(B*heads, N, N)", logits.shape),
        row(
            "softmax",
            "over the keys: each row sums to 1",
            "(B*heads, N, N)",
            trace.pick(attn, "_softmax", aten=True).shape,
        ),
        row("weighted values", "bmm(softmax, v)", "(B*heads, N, hd)", values.shape),
        row("merge heads", "transpose + view", "(N*B, D)", merged),
        FlowRow(
            f"{attn}.out_proj",
            "attention projection",
            f"Linear {dim}->{dim} (called as F.linear)",
            "(N*B, D)",
            out_proj.shape,
            _module_params(mha.out_proj),
            i,
        ),
        row("batch first", "view + transpose(0, 1)", "(B, N, D)", trace.outputs[attn]),
        FlowRow(
            path, "residual", "x + attention", "(B, N, D)", trace.pick(path, "add", 0).shape, 0, i
        ),
        module_row(f"{path}.norm2", "MLP norm", "LayerNorm", "(B, N, D)", i),
        FlowRow(
            f"{path}.linear1",
            "MLP hidden",
            f"Linear {dim}->{hidden} + GELU",
            "(B, N, hidden)",
            trace.pick(path, "gelu").shape,
            _module_params(layer.linear1),
            i,
        ),
        module_row(f"{path}.linear2", "MLP output", f"Linear {hidden}->{dim}", "(B, N, D)", i),
        FlowRow(path, "residual", "x + MLP", "(B, N, D)", trace.pick(path, "add", 1).shape, 0, i),
    ]


def compare_params(native: ModelFlow, other: ModelFlow) -> str:
    """Two encoders' parameter counts per stage, side by side (stages matched by role and
    block); blocks after the first folded into one line when each repeats block 0."""
    ours, theirs = _stage_params(native), _stage_params(other)
    keys = list(ours) + [key for key in theirs if key not in ours]
    depth = len(native.blocks())
    fold = depth > 1 and native.blocks_alike() and other.blocks_alike()
    lines = []
    for n, (block, role) in enumerate(keys):
        if fold and block is not None and block > 0:
            continue
        (stage_a, count_a), (stage_b, count_b) = (
            counts.get((block, role), ("-", 0)) for counts in (ours, theirs)
        )
        name = f"block {block}: {role}" if block is not None else role
        lines.append((name, stage_a, f"{count_a:,}", stage_b, f"{count_b:,}"))
        if fold and block == 0 and all(key[0] != 0 for key in keys[n + 1 :]):
            later = [
                sum(c for (b, _), (_, c) in counts.items() if b is not None and b > 0)
                for counts in (ours, theirs)
            ]
            each = "each as block 0"
            name = f"blocks 1-{depth - 1}" if depth > 2 else "block 1"
            lines.append((name, each, f"{later[0]:,}", each, f"{later[1]:,}"))
    header = ("Stage", f"{native.encoder} encoder", "Params", f"{other.encoder} encoder", "Params")
    total = ("total", "", f"{native.total_params:,}", "", f"{other.total_params:,}")
    return "\n".join(_table(header, [*lines, total], right=(2, 4)))


def _stage_params(flow: ModelFlow) -> dict[tuple[int | None, str], tuple[str, int]]:
    """(block, role) -> (stage, parameters) of the stages that own parameters."""
    out: dict[tuple[int | None, str], tuple[str, int]] = {}
    for row in flow.rows:
        if row.params:
            stage, count = out.get((row.block, row.role), (row.stage, 0))
            out[(row.block, row.role)] = (stage, count + row.params)
    return out
