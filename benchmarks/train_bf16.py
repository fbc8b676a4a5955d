"""bf16 autocast training on the CPU: vitkit's step against timm's, and against its own fp32.

    python benchmarks/train_bf16.py                     # ViT-S/16 b32 and ViT-B/16 b32
    python benchmarks/train_bf16.py --models vit_tiny_patch16_224 --batch 4 --rounds 1

One training step is a forward, backward and AdamW step on one batch kept in memory, each
library with the optimiser its users get (vitkit's `build_optimizer`, torch's fused AdamW;
timm's `create_optimizer_v2('adamw')`), weight decay 0.05. vitkit under bf16 autocast, timm
under the same autocast on the same weights, and vitkit in float32 run alternately round by
round (order reversed every other round), so a noisy machine slows them alike; the ratios are
medians of per-round ratios. Whether `--amp bf16` should be the default on a native-bf16 CPU
is the 'bf16 / fp32' column: the step time it saves.

The GEMM fraction is one profiled step of each (torch.profiler): the self CPU time of the
matrix products and attention kernels (aten::mm, addmm, bmm, linear, matmul, SDPA and its
backward, oneDNN's inner products) over the self CPU time of all operators. What is not GEMM
(layer norms, GELU, softmax, casts to and from bf16, the optimiser) is what fusion can still
win; a step that is mostly GEMM runs at the rate of the machine's bf16 products.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    import vitkit
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import vitkit
from vitkit.train.optim import build_optimizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import alternate, environment, onednn_has_kernels, timm  # noqa: E402

GEMM_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "mkldnn::_linear_pointwise",
    "aten::mkldnn_linear",
)
GEMM_PREFIXES = ("aten::_scaled_dot_product", "aten::scaled_dot_product")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="bf16 autocast training step, vitkit vs timm vs vitkit fp32, with the GEMM "
        "fraction",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", default="vit_small_patch16_224,vit_base_patch16_224")
    p.add_argument("--batch", type=int, default=32, help="images per step")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each step")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--no-timm", action="store_true", help="vitkit alone")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def step_of(model: nn.Module, optimizer, x: torch.Tensor, bf16: bool) -> Callable[[], None]:
    """One forward, backward and optimiser step, under bf16 autocast when `bf16`."""
    target = torch.randint(0, 1000, (x.shape[0],))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def is_gemm(name: str) -> bool:
    return name in GEMM_OPS or name.startswith(GEMM_PREFIXES)


def gemm_fraction(step: Callable[[], None]) -> dict:
    """The share of one step's operator self CPU time spent in GEMMs, and the top GEMMs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemms = {e.key: e.self_cpu_time_total for e in events if is_gemm(e.key)}
    return {
        "fraction": sum(gemms.values()) / total if total else 0.0,
        "self_cpu_ms": total / 1e3,
        "gemm_ms": {k: v / 1e3 for k, v in sorted(gemms.items(), key=lambda kv: -kv[1])},
    }


def build_steps(name: str, batch: int, with_timm: bool) -> dict[str, Callable[[], None]]:
    """'vitkit bf16', 'timm bf16' (same weights) and 'vitkit fp32' steps of preset `name`."""
    torch.manual_seed(0)
    ours = vitkit.create_model(name).train()
    x = torch.randn(batch, 3, *ours.patch_embed.img_size)
    fp32 = vitkit.create_model(name).train()
    fp32.load_state_dict(ours.state_dict())
    steps = {
        "vitkit bf16": step_of(ours, build_optimizer(ours, 1e-4, 0.05), x, bf16=True),
        "vitkit fp32": step_of(fp32, build_optimizer(fp32, 1e-4, 0.05), x, bf16=False),
    }
    if with_timm:
        from timm.optim import create_optimizer_v2

        theirs = timm.create_model(name, pretrained=False).train()
        theirs.load_state_dict(ours.state_dict())
        optimizer = create_optimizer_v2(theirs, "adamw", lr=1e-4, weight_decay=0.05)
        steps["timm bf16"] = step_of(theirs, optimizer, x, bf16=True)
    return steps


def per_round_ratio(times: dict[str, list[float]], slow: str, fast: str) -> float | None:
    if slow not in times or fast not in times:
        return None
    return statistics.median(s / f for s, f in zip(times[slow], times[fast]))


def run_model(name: str, args: argparse.Namespace, with_timm: bool) -> dict:
    steps = build_steps(name, args.batch, with_timm)
    times = alternate(steps, args, torch.device("cpu"))
    return {
        "model": name,
        "batch": args.batch,
        "images_per_s": {k: args.batch / statistics.median(v) for k, v in times.items()},
        "seconds": times,
        "vitkit_vs_timm_bf16": per_round_ratio(times, "timm bf16", "vitkit bf16"),
        "bf16_vs_fp32": per_round_ratio(times, "vitkit fp32", "vitkit bf16"),
        "gemm": {k: gemm_fraction(step) for k, step in steps.items()},
    }


def render(report: dict) -> str:
    env = report["env"]
    lines = [
        f"{env['date']} · {env['cpu']} ({env['cpu_capability']}; "
        f"{' '.join(env['cpu_flags']) or 'no bf16 / AMX flags'}) · {env['cpu_count']} cores · "
        f"{env['threads']} threads · torch {env['torch']} · timm {env['timm'] or '-'}",
        f"training step (forward, backward, AdamW), medians over {report['rounds']} alternating "
        "rounds; ratios are medians of per-round ratios; GEMM = share of one profiled step's "
        "operator self CPU time",
        "",
        "| model | batch | vitkit bf16 img/s | timm bf16 img/s | vitkit fp32 img/s "
        "| vitkit/timm (bf16) | bf16/fp32 (vitkit) | GEMM vitkit bf16 | GEMM timm bf16 "
        "| GEMM vitkit fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        rate, gemm = r["images_per_s"], r["gemm"]

        def cell(value, spec):
            return "-" if value is None else format(value, spec)

        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    str(r["batch"]),
                    cell(rate.get("vitkit bf16"), ".1f"),
                    cell(rate.get("timm bf16"), ".1f"),
                    cell(rate.get("vitkit fp32"), ".1f"),
                    cell(r["vitkit_vs_timm_bf16"], ".2f"),
                    cell(r["bf16_vs_fp32"], ".2f"),
                    *(
                        cell(gemm[k]["fraction"] if k in gemm else None, ".0%")
                        for k in ("vitkit bf16", "timm bf16", "vitkit fp32")
                    ),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not onednn_has_kernels(torch.bfloat16):
        print("note: this CPU has no native bf16 (AVX-512 BF16 / AMX); bf16 runs emulated")
    with_timm = timm is not None and not args.no_timm
    args.repeats = args.rounds  # the names `throughput.alternate` reads
    env_args = argparse.Namespace(threads=torch.get_num_threads(), no_timm=not with_timm)
    report = {
        "env": environment(torch.device("cpu"), env_args),
        "native_bf16": onednn_has_kernels(torch.bfloat16),
        "rounds": args.rounds,
        "results": [],
    }
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        print(f"{name} batch {args.batch} ...", flush=True)
        report["results"].append(run_model(name, args, with_timm))
    print()
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
