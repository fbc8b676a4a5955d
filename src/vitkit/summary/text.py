"""Plain-text rendering shared by the summary tables."""

from __future__ import annotations


def table(
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


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def millions(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def human_flops(flops: int) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return str(flops)
