"""One forward pass, recorded: every sub-module's input and output shapes (first call), and every
torch function (and aten operator) with the sub-module it runs in, so that each stage a model
describes (`vitkit.model.stages`) is measured as the model itself produced it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..model.stages import Input, Measure, Op, Output, Unfold


def first_tensor(output: object) -> Tensor | None:
    """A module's output tensor, or the first of a tuple / list of them."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


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
        tensor = first_tensor(out)
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
        tensor = first_tensor(out)
        if tensor is not None:
            name = func.overloadpacket.__name__
            self.events.append(
                _Event(self.scopes[-1], name, tuple(tensor.shape), _tensor_shapes(args))
            )
        return out


@dataclass
class Recording:
    """What one forward pass recorded: ops per module scope, and each module's input and
    output shapes (first call)."""

    functions: dict[str, list[_Event]] = field(default_factory=dict)
    aten: dict[str, list[_Event]] = field(default_factory=dict)
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def shape_of(self, measure: Measure) -> tuple[int, ...]:
        """The shape a stage's `measure` names, as this pass produced it."""
        if isinstance(measure, (Output, Input, Unfold)):
            seen = self.outputs if isinstance(measure, Output) else self.inputs
            if measure.path not in seen:
                raise RuntimeError(
                    f"the walk saw no call of {measure.path or 'the model'}; summary.flow cannot "
                    "measure this stage: use summary() for the module table"
                )
            shape = seen[measure.path]
            if isinstance(measure, Unfold):  # (B, C, H, W) -> (B, C*kh*kw, patches)
                (kh, kw), (batch, chans, height, width) = measure.kernel, shape
                return (batch, chans * kh * kw, (height // kh) * (width // kw))
            return shape
        event = self._pick(measure)
        return event.shape if measure.arg is None else event.inputs[measure.arg]

    def _pick(self, op: Op) -> _Event:
        """The `nth` op named one of `op.names` (of `op.ndim` dimensions) run in `op.scope`."""
        found = [
            event
            for event in (self.aten if op.aten else self.functions).get(op.scope, [])
            if event.name in op.names and (op.ndim is None or len(event.shape) == op.ndim)
        ]
        if not -len(found) <= op.nth < len(found):
            where = op.scope or "the model"
            raise RuntimeError(
                f"the walk found no {' or '.join(op.names)} #{op.nth} in {where}; summary.flow "
                "does not know this layer's forward: use summary() for the module table"
            )
        return found[op.nth]


def _need_weights(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # nn.MultiheadAttention asked for no weights takes the fused kernel; asking for them runs
    # the explicit products, so their shapes can be seen (same outputs).
    return args, {**kwargs, "need_weights": True, "average_attn_weights": False}


def record(model: nn.Module, x: Tensor) -> Recording:
    """Run `model(x)` with grad on (no fused inference path hides a sub-layer), recording
    every sub-module's shapes and every torch function and aten operator it calls."""
    recording = Recording()
    scopes = [""]
    names = {module: name for name, module in model.named_modules()}

    def enter(module: nn.Module, args: tuple) -> None:
        scopes.append(names[module])
        tensor = first_tensor(args)
        if tensor is not None:
            recording.inputs.setdefault(names[module], tuple(tensor.shape))

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        scopes.pop()
        tensor = first_tensor(output)
        if tensor is not None:
            recording.outputs.setdefault(names[module], tuple(tensor.shape))

    hooks = []
    for module in model.modules():
        hooks.append(module.register_forward_pre_hook(enter))
        hooks.append(module.register_forward_hook(leave))
        if isinstance(module, nn.MultiheadAttention):
            hooks.append(module.register_forward_pre_hook(_need_weights, with_kwargs=True))
    functions, aten = _FunctionRecorder(scopes), _AtenRecorder(scopes)
    try:
        with torch.enable_grad(), functions, aten:
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    for target, events in ((recording.functions, functions.events), (recording.aten, aten.events)):
        for event in events:
            target.setdefault(event.scope, []).append(event)
    return recording


@contextlib.contextmanager
def explicit_attention(model: nn.Module) -> Iterator[None]:
    """The model with its attention computed as softmax(q k^T) v (each `fused_attn` flag off,
    as timm's attention layers name it) in eval mode, restored afterwards with its training
    flag. The CPU fast path needs nothing: grad stays on, so its layers run their plain
    function."""
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
