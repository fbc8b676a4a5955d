"""The per-layer table of any model: output shape, parameters and FLOPs, with totals.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode` (see `flop_counter`): a multiply-add
counts as 2, and matrix products, convolutions and attention are counted (elementwise ops,
norms and activations are not, as is usual for such tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .record import first_tensor
from .text import human_flops, table


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
                human_flops(row.flops) if row.flops else "-",
            )
            for row in self.rows
        ]
        body = table(header, lines, right=(1, 2, 3))
        return "\n".join(
            [
                *body,
                f"Input size: {'x'.join(str(d) for d in self.input_size)}",
                f"Total params: {self.total_params:,}",
                f"Trainable params: {self.trainable_params:,}",
                f"Non-trainable params: {self.total_params - self.trainable_params:,}",
                f"Total FLOPs: {human_flops(self.total_flops)} ({self.total_flops:,})",
                body[0],
            ]
        )


def _run_hooked(
    model: nn.Module, x: torch.Tensor, counter: FlopCounterMode
) -> tuple[list[str], dict[str, tuple[int, ...] | None]]:
    """One forward pass in eval mode under `counter`: the modules' names in call order
    (parents before children) and each one's output shape; the training flag is restored."""
    shapes: dict[str, tuple[int, ...] | None] = {}
    order: list[str] = []
    names = {module: name for name, module in model.named_modules()}

    def enter(module: nn.Module, _inputs: object) -> None:
        if names[module] not in order:
            order.append(names[module])

    def leave(module: nn.Module, _inputs: object, output: object) -> None:
        tensor = first_tensor(output)
        shapes[names[module]] = tuple(tensor.shape) if tensor is not None else None

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]
    was_training = model.training
    model.eval()
    try:
        # Grad stays on so fused inference fast paths (which hide sub-layers) are not taken.
        with torch.enable_grad(), counter:
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return order, shapes


def summary(model: nn.Module, input_size: tuple[int, ...], max_depth: int = 3) -> ModelSummary:
    """Run one batch of zeros through `model` and tabulate every layer.

    Args:
        model: any module; its training flag is restored afterwards.
        input_size: (B, C, H, W), or (C, H, W) for batch 1.
        max_depth: deepest module level listed (the totals always cover everything).
    """
    if len(input_size) == 3:
        input_size = (1, *input_size)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    counter = flop_counter()
    order, shapes = _run_hooked(model, torch.zeros(input_size, device=device, dtype=dtype), counter)
    flop_counts = counter.get_flop_counts()
    root = type(model).__name__
    modules = dict(model.named_modules())
    result = ModelSummary(input_size=tuple(input_size))
    for name in order:
        depth = 0 if not name else name.count(".") + 1
        module = modules[name]
        if depth > max_depth or isinstance(module, nn.Identity):
            continue
        key = root if not name else f"{root}.{name}"
        result.rows.append(
            LayerRow(
                name=name or root,
                kind=type(module).__name__,
                depth=depth,
                output_shape=shapes[name],
                params=sum(p.numel() for p in module.parameters()),
                flops=int(sum(flop_counts.get(key, {}).values())),
            )
        )
    result.total_params = sum(p.numel() for p in model.parameters())
    result.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result.total_flops = int(sum(flop_counts.get("Global", {}).values()))
    return result
