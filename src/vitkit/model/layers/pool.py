"""Tokens to one vector per image, as timm's `global_pool_nlc` reads a `(B, P + N, D)` sequence
of P prefix tokens (class, registers) and N patch tokens: the class token, or the mean, max or
their average over the patch tokens (over every token with `include_prefix`)."""

from __future__ import annotations

from torch import Tensor

TOKEN_POOLS = ("token", "avg", "max", "avgmax")


def pool_tokens(
    x: Tensor, pool_type: str, num_prefix_tokens: int, include_prefix: bool = False
) -> Tensor:
    """(B, P + N, D) -> (B, D) by `pool_type` (one of `TOKEN_POOLS`)."""
    if pool_type == "token":
        return x[:, 0]
    if not include_prefix:
        x = x[:, num_prefix_tokens:]  # (B, N, D)
    if pool_type == "avg":
        return x.mean(dim=1)
    if pool_type == "max":
        return x.amax(dim=1)
    return 0.5 * (x.amax(dim=1) + x.mean(dim=1))  # avgmax
