"""How a model describes its forward pass, stage by stage, for `vitkit.summary.flow`.

A model's `describe_flow(input_size)` returns a `FlowSpec`: plain data naming each stage, what it
does, its layout, the parameters it owns and where its output shape can be measured in one
forward pass (a sub-module's output or input, or an operator called inside a sub-module). The
summary runs the model once, measures every stage and renders the table; it knows no attribute
name of any architecture, so a second one (a Swin) describes its own stages the same way.
"""

from __future__ import annotations

from dataclasses import dataclass


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
