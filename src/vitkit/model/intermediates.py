"""Intermediate features: the outputs of chosen blocks as feature maps, for backbones, linear
probing and dense tasks.

The conventions are timm's `forward_intermediates` (Wightman, pytorch-image-models) and
DINO's `get_intermediate_layers` (Caron et al., "Emerging Properties in Self-Supervised Vision
Transformers", ICCV 2021); `VisionTransformer` inherits them from `IntermediateFeatures`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn


def take_indices(num_blocks: int, indices: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """Resolve `indices` (None: all, int n: the last n, list: those, negative from the end)
    to block positions 0..num_blocks-1, in the order asked."""
    if indices is None:
        return list(range(num_blocks))
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(
                f"indices={indices} asks for the last {indices} blocks of a model with "
                f"{num_blocks}; pass an int from 1 to {num_blocks}, or a list of block indices"
            )
        return list(range(num_blocks - indices, num_blocks))
    resolved = []
    for index in indices:
        if not -num_blocks <= index < num_blocks:
            raise ValueError(
                f"block index {index} is out of range for a model with {num_blocks} blocks; "
                f"use 0 to {num_blocks - 1}, or -{num_blocks} to -1 from the end"
            )
        resolved.append(index % num_blocks)
    if not resolved:
        raise ValueError("indices is empty; pass at least one block index")
    return resolved


def split_tokens(
    tokens: Tensor,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    output_fmt: str,
    return_prefix_tokens: bool,
) -> Any:
    """One block's tokens (B, P + N, D) -> its patch features, as a map (B, D, H/ph, W/pw) for
    'NCHW' or tokens (B, N, D) for 'NLC'; with `return_prefix_tokens`, paired with (B, P, D)."""
    prefix = tokens[:, :num_prefix_tokens]  # (B, P, D)
    feats = tokens[:, num_prefix_tokens:]  # (B, N, D)
    if output_fmt == "NCHW":
        feats = feats.reshape(tokens.shape[0], grid[0], grid[1], -1)  # (B, H/ph, W/pw, D)
        feats = feats.permute(0, 3, 1, 2).contiguous()  # (B, D, H/ph, W/pw)
    return (feats, prefix) if return_prefix_tokens else feats


class IntermediateFeatures:
    """`forward_intermediates` and `get_intermediate_layers` for `VisionTransformer`: they read
    its `block_list`, `embed`, `norm`, `patch_embed`, `num_prefix_tokens` and checkpointing."""

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NCHW",
        return_prefix_tokens: bool = False,
        intermediates_only: bool = False,
        stop_early: bool = False,
    ) -> tuple[Tensor, list[Any]] | list[Any]:
        """The outputs of chosen blocks, as feature maps (backbones, probing, dense tasks).

        Conventions follow timm's `forward_intermediates`, except that the intermediates come
        back in the order `indices` asks for them.

        Args:
            x: images (B, C, H, W).
            indices: None for every block, an int n for the last n blocks, or a list of block
                indices (negative ones count from the end).
            norm: apply the final norm (`model.norm`) to each intermediate.
            output_fmt: 'NCHW' for maps (B, D, H/ph, W/pw) with the prefix (class /
                distillation) tokens split off, or 'NLC' for the patch tokens (B, N, D).
            return_prefix_tokens: make each intermediate a pair (features, prefix tokens
                (B, P, D)).
            intermediates_only: return only the list of intermediates.
            stop_early: skip the blocks after the last one asked for (needs
                `intermediates_only`, since there are then no final features).

        Returns:
            `(final, intermediates)`: `final` is `forward_features(x)`, (B, P + N, D); or just
            `intermediates` with `intermediates_only=True`.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        if stop_early and not intermediates_only:
            raise ValueError(
                "stop_early=True skips the last blocks, so there are no final features; "
                "pass intermediates_only=True with it"
            )
        blocks = self.block_list()
        take = take_indices(len(blocks), indices)
        if stop_early:
            blocks = blocks[: max(take) + 1]
        tokens = self.embed(x)  # (B, P + N, D); checks the input first
        grid = self.patch_embed.grid_for(*x.shape[-2:])
        tokens, outputs = self._run_blocks(tokens, blocks, take, norm, grid)
        intermediates = [
            split_tokens(outputs[i], self.num_prefix_tokens, grid, output_fmt, return_prefix_tokens)
            for i in take
        ]
        if intermediates_only:
            return intermediates
        return self.norm(tokens), intermediates

    def _run_blocks(
        self,
        tokens: Tensor,
        blocks: list[nn.Module],
        take: list[int],
        norm: bool,
        grid: tuple[int, int],
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """Tokens (B, P + N, D) through `blocks`, keeping (and with `norm`, normalising) the
        outputs of the blocks in `take`; checkpointed as `encode` is. ViTDet's blocks
        (`spatial_blocks`) run on maps (B, H/ph, W/pw, D) of the `grid`."""
        outputs: dict[int, Tensor] = {}
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        shape = tokens.shape
        if self.spatial_blocks:
            tokens = tokens.reshape(shape[0], grid[0], grid[1], shape[2])  # (B, H/ph, W/pw, D)
        for i, block in enumerate(blocks):
            if checkpointing:
                tokens = torch.utils.checkpoint.checkpoint(block, tokens, use_reentrant=False)
            else:
                tokens = block(tokens)
            if i in take:
                out = tokens.reshape(shape)  # (B, P + N, D)
                outputs[i] = self.norm(out) if norm else out
        return tokens.reshape(shape), outputs

    def get_intermediate_layers(
        self,
        x: Tensor,
        n: int | list[int] | tuple[int, ...] = 1,
        *,
        reshape: bool = False,
        norm: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[Any]:
        """DINO's interface: the last `n` blocks' patch tokens (B, N, D), or maps
        (B, D, H/ph, W/pw) with `reshape`; `n` may also be a list of block indices."""
        return self.forward_intermediates(
            x,
            n,
            norm=norm,
            output_fmt="NCHW" if reshape else "NLC",
            return_prefix_tokens=return_prefix_tokens,
            intermediates_only=True,
            stop_early=True,
        )
