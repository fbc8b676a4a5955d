"""The stage-by-stage walk (`vitkit summary --flow`): the stages a model describes
(`describe_flow`, see `vitkit.model.stages`), each measured in one forward pass of zeros, as a
table; and two encoders' parameters side by side (`--compare-torch`)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import torch
from torch import nn

from .record import explicit_attention, record
from .text import millions, shape_text, table

LEGEND_WIDTH = 100  # the layout legend is wrapped to this many columns


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
    blocks_path: str = "blocks"
    legend: str = field(default="", repr=False)
    fold: str = "identical"

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
            # Each stage named relative to its block: blocks.3.attn -> blocks.#.attn
            own = [f"{self.blocks_path}.{r.block}" for r in rows]
            stages = [
                f"{self.blocks_path}.#{r.stage[len(p) :]}" if r.stage.startswith(p) else r.stage
                for r, p in zip(rows, own)
            ]
            return [(s, r.operation, r.layout, r.shape, r.params) for s, r in zip(stages, rows)]

        blocks = list(self.blocks().values())
        return all(key(rows) == key(blocks[0]) for rows in blocks[1:])

    def shown_rows(self, all_blocks: bool = False) -> list[FlowRow]:
        """The rows of the table: blocks after the first folded into one line when they all
        repeat block 0, or with `fold='pattern'` each block that repeats an earlier one
        (`all_blocks` lists every one)."""
        blocks = self.blocks()
        if self.fold == "pattern" and not all_blocks:
            return _fold_patterns(self.rows, blocks)
        if all_blocks or len(blocks) < 2 or not self.blocks_alike():
            return list(self.rows)
        rest = [row for i, rows in blocks.items() if i > 0 for row in rows]
        last = max(blocks)
        folded = FlowRow(
            stage=f"{self.blocks_path}.1-{last}" if last > 1 else f"{self.blocks_path}.1",
            role=f"{last} more blocks" if last > 1 else "1 more block",
            detail="each exactly as block 0",
            layout=blocks[0][-1].layout,
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
                shape_text(r.shape),
                "-" if r.params is None else f"{r.params:,}",
            )
            for r in self.shown_rows(all_blocks)
        ]
        body = table(header, lines, right=(4,))
        gh, gw = self.grid
        return "\n".join(
            [
                *body,
                f"Input: {shape_text(self.input_size)}; {gh}x{gw} grid = {self.patches} patches, "
                f"{self.tokens} tokens; encoder: {self.encoder}",
                f"Total params: {self.total_params:,} ({millions(self.total_params)})",
                *textwrap.wrap(f"Layout: {self.legend}", LEGEND_WIDTH, subsequent_indent="  "),
                body[0],
            ]
        )

    def __str__(self) -> str:
        return self.render()


def _prefix(rows: list[FlowRow]) -> str:
    """The module path a block's rows share ('layers.1.blocks.0')."""
    parts = [row.stage.split(".") for row in rows]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common)


def _fold_patterns(rows: list[FlowRow], blocks: dict[int, list[FlowRow]]) -> list[FlowRow]:
    """`rows` with each block whose stages (names within the block, roles, layouts) repeat
    an earlier shown block's folded into one line: its output shape and parameters."""
    shown: dict[tuple, str] = {}
    folded: dict[int, FlowRow] = {}
    for index, block_rows in blocks.items():
        prefix = _prefix(block_rows)
        key = tuple((r.stage[len(prefix) :], r.role, r.layout) for r in block_rows)
        if key not in shown:
            shown[key] = prefix
            continue
        folded[index] = FlowRow(
            stage=prefix,
            role="block",
            detail=f"each stage as in {shown[key]}",
            layout=block_rows[-1].layout,
            shape=block_rows[-1].shape,
            params=sum(row.params or 0 for row in block_rows),
        )
    out: list[FlowRow] = []
    for row in rows:
        if row.block not in folded:
            out.append(row)
        elif row is blocks[row.block][-1]:
            out.append(folded[row.block])
    return out


def flow(model: nn.Module, input_size: tuple[int, ...]) -> ModelFlow:
    """The forward pass of a model that describes its stages (`describe_flow`: a vitkit
    `VisionTransformer`, `SwinTransformer`, `Eva`, `Beit` or ViTDet pyramid), stage by stage:
    one batch of zeros runs through the model, attention computed explicitly, while every torch
    function (and, inside `nn.MultiheadAttention`, every aten operator) is recorded with the
    module it runs in, so each shape is the one the model produced, for any option and either
    encoder.

    Args:
        model: a `VisionTransformer` (native blocks or `encoder='torch'`), a
            `SwinTransformer`, ...; its attention kernel choice and training flag are restored
            afterwards.
        input_size: (B, C, H, W), or (C, H, W) for batch 1.
    """
    describe = getattr(model, "describe_flow", None)
    if describe is None:
        raise TypeError(
            f"flow walks a model that describes its stages (a vitkit VisionTransformer), not "
            f"{type(model).__name__}; use summary() for any module"
        )
    if len(input_size) == 3:
        input_size = (1, *input_size)
    spec = describe(tuple(input_size))
    param = next(model.parameters())
    with explicit_attention(model):
        recording = record(model, torch.zeros(input_size, device=param.device, dtype=param.dtype))
    rows = [
        FlowRow(
            s.name, s.role, s.detail, s.layout, recording.shape_of(s.measure), s.params, s.block
        )
        for s in spec.stages
    ]
    return ModelFlow(
        input_size=tuple(input_size),
        encoder=spec.encoder,
        rows=rows,
        total_params=sum(p.numel() for p in model.parameters()),
        patches=recording.shape_of(spec.patches)[1],
        grid=spec.grid,
        tokens=recording.shape_of(spec.tokens)[1],
        blocks_path=spec.blocks,
        legend=spec.legend,
        fold=spec.fold,
    )


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
    return "\n".join(table(header, [*lines, total], right=(2, 4)))


def _stage_params(flow: ModelFlow) -> dict[tuple[int | None, str], tuple[str, int]]:
    """(block, role) -> (stage, parameters) of the stages that own parameters."""
    out: dict[tuple[int | None, str], tuple[str, int]] = {}
    for row in flow.rows:
        if row.params:
            stage, count = out.get((row.block, row.role), (row.stage, 0))
            out[(row.block, row.role)] = (stage, count + row.params)
    return out
