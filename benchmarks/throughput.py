"""Throughput, memory and FLOP utilisation of vitkit against timm, on the same weights.

    python benchmarks/throughput.py                      # the README table (CPU, ~5 min)
    python benchmarks/throughput.py --help
    python benchmarks/throughput.py --device cuda --dtypes bf16 --batch-sizes 256 \\
        --models vit_base_patch16_224 --compile off,on --json gpu.json

Each timm model gets vitkit's state dict (the keys are timm's), and the outputs are compared
before timing. The two implementations then run alternately, round by round, in one process
(ABBA order), so a noisy machine slows both alike; medians over the timed rounds, warm-up
rounds excluded. Peak memory is what one step allocates on top of what was allocated before
it (weights, optimiser state): on CPU the running total of PyTorch's allocator recorded by
`torch.profiler` (library-internal scratch of MKL / oneDNN is not seen), on a GPU
`torch.cuda.max_memory_allocated`. FLOPs are counted by `vitkit.summary.flop_counter` on the
meta device (matrix products and attention, 2 per multiply-add; backward included for
training) and put against the rate of a large matrix product timed in every round beside the
models: the faster of `torch.mm` and, on CPU, oneDNN's inner product (the kernel of vitkit's
fused path, faster than MKL's `torch.mm` on some CPUs) in that round. The fraction is the median
of per-round ratios, as for vitkit / timm, so a shared machine's slow spell moves the model and
its ceiling alike.

dtypes: `fp32` runs everything in float32. `bf16` / `fp16` run inference on weights and
inputs cast to that dtype, and training under autocast with float32 weights.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
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
from vitkit.model import find_architecture  # noqa: E402
from vitkit.summary import flop_counter  # noqa: E402

try:
    import timm
except ImportError:
    timm = None

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_MODELS = "vit_tiny_patch16_224,vit_small_patch16_224,vit_base_patch16_224"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="vitkit vs timm: images/s, peak memory, FLOP utilisation, token scaling.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated preset names")
    p.add_argument("--batch-sizes", default="32", help="comma-separated batch sizes")
    p.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, bf16, fp16")
    p.add_argument("--modes", default="infer,train", help="comma-separated: infer, train")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument(
        "--compile", default="off", help="comma-separated: off, on (torch.compile both models)"
    )
    p.add_argument(
        "--grad-ckpt-model",
        default="vit_base_patch16_224",
        help="training with and without gradient checkpointing ('' to skip)",
    )
    p.add_argument("--scaling-model", default="vit_small_patch16_224", help="'' to skip")
    p.add_argument("--scaling-sizes", default="224,384,512", help="input sizes for scaling")
    p.add_argument("--scaling-batch", type=int, default=8)
    p.add_argument("--channels-last", action="store_true", help="channels-last input and conv")
    p.add_argument("--no-fast-path", action="store_true", help="model.set_fast_path(False)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory steps")
    p.add_argument("--no-timm", action="store_true", help="run vitkit alone")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n matmul")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    return p.parse_args(argv)


def csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# -- measuring -------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def onednn_has_kernels(dtype: torch.dtype) -> bool:
    """Whether oneDNN's CPU inner product runs in `dtype` here (bf16 / fp16 need the ISA)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return {
        torch.float32: True,
        torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    }.get(dtype, False)


def matmul_steps(
    device: torch.device, dtype: torch.dtype, n: int
) -> dict[str, Callable[[], object]]:
    """n x n x n matrix products (2 n^3 FLOPs each), the practical ceiling for the models:
    torch.mm, and on CPU also oneDNN's inner product, which vitkit's fused path uses."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    steps: dict[str, Callable[[], object]] = {"torch.mm": lambda: a @ b}
    if device.type == "cpu" and onednn_has_kernels(dtype):
        steps["onednn.mm"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    return steps


def matmul_gflops(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best GFLOP/s of `matmul_steps` over `repeats` runs of each."""
    best = math.inf
    for step in matmul_steps(device, dtype, n).values():
        step()
        best = min(best, *(timed(step, device) for _ in range(repeats)))
    return 2 * n**3 / best / 1e9


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes allocated at the peak of `fn()` above what was allocated when it started."""
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    peak = 0
    while stack:  # total_allocated: the allocator's running total since profiling began
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            peak = max(peak, node.extra_fields.total_allocated)
    return peak


def count_flops(model: nn.Module, batch: int) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of one batch, counted on a copy on the meta device."""
    model = copy.deepcopy(model).to("meta").train()
    x = torch.randn(batch, model.config.in_chans, *model.patch_embed.img_size, device="meta")
    with flop_counter() as counter:
        model(x)
    forward = counter.get_total_flops()
    with flop_counter() as counter:
        model(x).sum().backward()
    return forward, counter.get_total_flops()


# -- the two implementations -----------------------------------------------------------------


def build_pair(name: str, args: argparse.Namespace, img_size: int | None = None):
    """vitkit's model and, when timm is there, timm's with the same weights (fp32, eval)."""
    overrides = {"img_size": img_size} if img_size else {}
    overrides["num_classes"] = 1000  # a head for the training step (a backbone name has none)
    ours = vitkit.create_model(name, **overrides).eval()
    if find_architecture(ours).fused_cpu:  # the families with a fused CPU path
        ours.set_fast_path(not args.no_fast_path)
    models = {"vitkit": ours}
    if timm is not None and not args.no_timm:
        theirs = timm.create_model(name, pretrained=False, **overrides).eval()
        theirs.load_state_dict(ours.state_dict())
        models["timm"] = theirs
    return models


def check_same_function(models: dict[str, nn.Module], x: torch.Tensor) -> float | None:
    """Max |vitkit - timm| of the logits: proof that both run the same weights."""
    if "timm" not in models:
        return None
    with torch.inference_mode():
        diff = (models["vitkit"](x) - models["timm"](x)).abs().max().item()
    if diff > 1e-3 * max(1.0, x.abs().max().item()):
        raise RuntimeError(f"vitkit and timm disagree by {diff:.3g}; the weights did not carry")
    return diff


def prepare(model: nn.Module, args: argparse.Namespace, device: torch.device, compiled: bool):
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return torch.compile(model) if compiled else model


def alternate(
    steps: dict[str, Callable[[], object]], args: argparse.Namespace, device: torch.device
) -> dict[str, list[float]]:
    """Run every step `warmup + repeats` times, alternating implementations (ABBA...)."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for round_ in range(args.warmup + args.repeats):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            elapsed = timed(steps[name], device)
            if round_ >= args.warmup:
                times[name].append(elapsed)
    return times


def alternate_with_matmul(steps, args, device, dtype) -> tuple[dict[str, list[float]], list[float]]:
    """`alternate`, with the matrix products in every round: the times of `steps`, and each
    round's matmul GFLOP/s (the faster kernel of that round)."""
    n = args.matmul_size
    matmuls = matmul_steps(device, dtype, n)
    times = alternate({**steps, **matmuls}, args, device)
    per_round = zip(*(times.pop(name) for name in matmuls))
    return times, [2 * n**3 / min(seconds) / 1e9 for seconds in per_round]


def summarise(times: dict[str, list[float]], batch: int) -> dict[str, dict]:
    out = {
        k: {"seconds": v, "images_per_s": batch / statistics.median(v)} for k, v in times.items()
    }
    if "timm" in times:  # the median of per-round ratios is robust to a slow round
        ratios = [t / v for v, t in zip(times["vitkit"], times["timm"])]
        out["vitkit"]["speedup_vs_timm"] = statistics.median(ratios)
    return out


def run_case(name, batch, dtype_name, compiled, args, device) -> list[dict]:
    """Inference and/or training of one model configuration, both implementations."""
    dtype = DTYPES[dtype_name]
    base = build_pair(name, args)
    fwd_flops, train_flops = count_flops(base["vitkit"], batch)
    size = base["vitkit"].patch_embed.img_size
    x32 = torch.randn(batch, 3, *size, device=device)
    if args.channels_last:
        x32 = x32.contiguous(memory_format=torch.channels_last)
    max_diff = check_same_function({k: m.to(device) for k, m in base.items()}, x32)
    rows = []
    common = {"model": name, "batch": batch, "dtype": dtype_name, "compile": compiled}
    if "infer" in csv(args.modes):
        models = {
            k: prepare(copy.deepcopy(m).to(dtype), args, device, compiled) for k, m in base.items()
        }
        steps = {k: infer_step(m, x32.to(dtype)) for k, m in models.items()}
        mem = {}
        if not args.no_memory:
            for k, step in steps.items():
                step()  # first call: compile / lazy init, outside the measurement
                mem[k] = peak_bytes(step, device)
        times, mm_rates = alternate_with_matmul(steps, args, device, dtype)
        result = summarise(times, batch)
        rows.append(row(common, "infer", result, mem, fwd_flops, mm_rates, max_diff))
        del models, steps
    if "train" in csv(args.modes):
        models = {
            k: prepare(copy.deepcopy(m).train(), args, device, compiled) for k, m in base.items()
        }
        steps = {k: train_step(m, x32, dtype, device) for k, m in models.items()}
        mem = {}
        for k, step in steps.items():
            step()  # creates the optimiser state, so the peak below is a steady-state step
            if not args.no_memory:
                mem[k] = peak_bytes(step, device)
        times, mm_rates = alternate_with_matmul(steps, args, device, dtype)
        result = summarise(times, batch)
        rows.append(row(common, "train", result, mem, train_flops, mm_rates, max_diff))
    return rows


def infer_step(model: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """One forward pass under `torch.inference_mode`."""

    def step():
        with torch.inference_mode():
            model(x)

    return step


def train_step(model: nn.Module, x: torch.Tensor, dtype: torch.dtype, device: torch.device):
    """One forward, backward and AdamW step; autocast when `dtype` is not float32."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    target = torch.randint(0, 1000, (x.shape[0],), device=device)
    autocast = (
        torch.autocast(device.type, dtype=dtype)
        if dtype != torch.float32
        else contextlib.nullcontext()
    )

    def step():
        with autocast:
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        # Freed here, inside the step that made them: the profiler sees both events.
        opt.zero_grad(set_to_none=True)

    return step


def row(common, mode, result, mem, flops, mm_rates, max_diff) -> dict:
    """One table row. "fraction_of_matmul" is the median over rounds of the model's GFLOP/s
    over the matmul's in the same round, like "speedup_vs_timm" robust to a slow spell."""
    out = {
        **common,
        "mode": mode,
        "flops_per_batch": flops,
        "matmul_gflops": statistics.median(mm_rates),
        "matmul_gflops_per_round": mm_rates,
        "max_abs_diff_vs_timm": max_diff,
    }
    for k, r in result.items():
        gflops = flops * r["images_per_s"] / common["batch"] / 1e9
        fractions = [flops / 1e9 / t / mm for t, mm in zip(r["seconds"], mm_rates)]
        out[k] = {
            **r,
            "gflops_per_s": gflops,
            "fraction_of_matmul": statistics.median(fractions),
            "peak_mib": mem[k] / 2**20 if k in mem else None,
        }
    return out


def grad_ckpt_case(name, batch, args, device) -> dict:
    """vitkit training with and without gradient checkpointing: peak memory and images/s."""
    model = vitkit.create_model(name).to(device).train()
    x = torch.randn(batch, 3, *model.patch_embed.img_size, device=device)
    out = {"model": name, "batch": batch}
    for enabled in (False, True):
        model.set_grad_checkpointing(enabled)
        step = train_step(model, x, torch.float32, device)
        step()
        peak = peak_bytes(step, device)
        times = [timed(step, device) for _ in range(max(1, args.repeats - 1))]
        out["on" if enabled else "off"] = {
            "peak_mib": peak / 2**20,
            "images_per_s": batch / statistics.median(times),
        }
    out["memory_saved"] = 1 - out["on"]["peak_mib"] / out["off"]["peak_mib"]
    return out


def scaling_case(name, sizes, batch, args, device) -> list[dict]:
    """Inference time against FLOPs as the token count grows (224 -> 384 -> 512)."""
    rows = []
    for size in sizes:
        models = {k: m.to(device) for k, m in build_pair(name, args, img_size=size).items()}
        flops, _ = count_flops(models["vitkit"], batch)
        x = torch.randn(batch, 3, size, size, device=device)
        steps = {k: infer_step(m, x) for k, m in models.items()}
        result = summarise(alternate(steps, args, device), batch)
        tokens = models["vitkit"].patch_embed.num_patches + models["vitkit"].num_prefix_tokens
        entry = {"img_size": size, "tokens": tokens, "flops_per_batch": flops}
        for k, r in result.items():
            entry[k] = {**r, "median_s": statistics.median(r["seconds"])}
        rows.append(entry)
    for entry in rows:
        entry["flop_ratio"] = entry["flops_per_batch"] / rows[0]["flops_per_batch"]
        for k in ("vitkit", "timm"):
            if k in entry:
                entry[k]["time_ratio"] = entry[k]["median_s"] / rows[0][k]["median_s"]
    return rows


# -- reporting -------------------------------------------------------------------------------


# the CPU features that decide the fast paths (bf16 / fp16 products, AMX tiles)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def environment(device: torch.device, args: argparse.Namespace) -> dict:
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels' ISA: AVX2, ...
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads() if device.type == "cpu" else args.threads,
        "device": str(device),
        "torch": torch.__version__,
        "timm": None if args.no_timm else getattr(timm, "__version__", None),
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def fmt_mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def cell(result: dict | None, key: str, spec: str) -> str:
    """One table cell: `result[key]` formatted, or '-' when there is no such value."""
    value = None if result is None else result.get(key)
    return "-" if value is None else format(value, spec)


def render(report: dict) -> str:
    """The Markdown tables for the README."""
    env = report["env"]
    rates = ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_gflops"].items())
    lines = [
        f"{env['date']} · {env['cpu']} ({env.get('cpu_capability', '?')}) · {env['device']} · "
        f"{env['threads']} threads · "
        f"torch {env['torch']} · timm {env['timm'] or 'not measured (vitkit alone)'}",
        f"matmul {report['matmul_size']}^3 GFLOP/s at the start: {rates}; 'mm GFLOP/s' below "
        "is the median over the model's rounds of the faster of torch.mm / oneDNN in each round, "
        "'of mm' the median of per-round ratios of the model's rate to it",
        "",
        "| model | batch | dtype | compile | mode | vitkit img/s | timm img/s | vitkit/timm "
        "| vitkit peak MiB | timm peak MiB | vitkit GFLOP/s | mm GFLOP/s | of mm |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        ours, theirs = r["vitkit"], r.get("timm")
        cells = [
            r["model"],
            str(r["batch"]),
            r["dtype"],
            "on" if r["compile"] else "off",
            r["mode"],
            cell(ours, "images_per_s", ".1f"),
            cell(theirs, "images_per_s", ".1f"),
            cell(ours, "speedup_vs_timm", ".2f") + ("x" if theirs else ""),
            cell(ours, "peak_mib", ",.0f"),
            cell(theirs, "peak_mib", ",.0f"),
            cell(ours, "gflops_per_s", ".0f"),
            cell(r, "matmul_gflops", ".0f"),
            cell(ours, "fraction_of_matmul", ".0%"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ckpt = report.get("grad_checkpointing")
    if ckpt:
        lines += [
            "",
            f"Gradient checkpointing, {ckpt['model']} training, batch {ckpt['batch']}, fp32 "
            f"(vitkit): peak memory {ckpt['memory_saved']:.0%} lower",
            "",
            "| grad checkpointing | peak MiB | img/s |",
            "|---|---:|---:|",
        ]
        for key in ("off", "on"):
            entry = ckpt[key]
            lines.append(f"| {key} | {entry['peak_mib']:,.0f} | {entry['images_per_s']:.1f} |")
    scaling = report.get("token_scaling")
    if scaling:
        lines += [
            "",
            f"Token scaling, {report['scaling_model']} inference, batch {report['scaling_batch']}"
            ", fp32 (time and FLOPs relative to the first size):",
            "",
            "| input | tokens | FLOP ratio | vitkit time ratio | timm time ratio | vitkit/timm |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for e in scaling:
            ours, theirs = e["vitkit"], e.get("timm")
            cells = [
                str(e["img_size"]),
                str(e["tokens"]),
                f"{e['flop_ratio']:.2f}",
                cell(ours, "time_ratio", ".2f"),
                cell(theirs, "time_ratio", ".2f"),
                cell(ours, "speedup_vs_timm", ".2f") + ("x" if theirs else ""),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available here", file=sys.stderr)
        return 2
    unknown = [d for d in csv(args.dtypes) if d not in DTYPES]
    if unknown:
        print(f"unknown dtype(s) {unknown}; choose from {sorted(DTYPES)}", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if timm is None and not args.no_timm:
        print("note: timm is not installed; measuring vitkit alone (pip install timm)")
    torch.manual_seed(0)
    report: dict = {
        "env": environment(device, args),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "matmul_size": args.matmul_size,
        "matmul_gflops": {
            d: matmul_gflops(device, DTYPES[d], args.matmul_size) for d in csv(args.dtypes)
        },
        "results": [],
    }
    print(f"matmul GFLOP/s: {report['matmul_gflops']}", flush=True)
    for name in csv(args.models):
        for batch in (int(b) for b in csv(args.batch_sizes)):
            for dtype_name in csv(args.dtypes):
                for compiled in (c == "on" for c in csv(args.compile)):
                    print(f"{name} batch {batch} {dtype_name} compile={compiled} ...", flush=True)
                    report["results"] += run_case(name, batch, dtype_name, compiled, args, device)
    if args.grad_ckpt_model:
        batch = int(csv(args.batch_sizes)[0])
        print(f"gradient checkpointing: {args.grad_ckpt_model} batch {batch} ...", flush=True)
        report["grad_checkpointing"] = grad_ckpt_case(args.grad_ckpt_model, batch, args, device)
    if args.scaling_model:
        print(f"token scaling: {args.scaling_model} ...", flush=True)
        sizes = [int(s) for s in csv(args.scaling_sizes)]
        report["scaling_model"], report["scaling_batch"] = args.scaling_model, args.scaling_batch
        report["token_scaling"] = scaling_case(
            args.scaling_model, sizes, args.scaling_batch, args, device
        )
    print()
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
