"""How vitkit's training step scales with the number of processes: DDP against FSDP.

    python benchmarks/scaling.py --sizes tiny --steps 2            # a smoke run (~1 min)
    python benchmarks/scaling.py                                   # ViT-B/16 and ViT-g/14
    python benchmarks/scaling.py --sizes g14 --procs 1,2,4 --json scaling.json
    python benchmarks/scaling.py --device cuda --procs 1,2,4,8     # one GPU per process

For each size, process count and mode, the script launches itself under torchrun (one
machine, gloo on CPU, NCCL on GPU), trains the model on random images for `--steps` steps
(AdamW, the training engine's `shard` for FSDP) and records per process the median step time
after `--warmup` steps and the peak memory: on CPU the process's peak resident set
(`ru_maxrss`: weights, gradients, optimiser state, activations, the communication buffers)
less its resident set before the model was built (Python, torch's libraries: ~0.6 GiB), on a
GPU `torch.cuda.max_memory_allocated`.

Sizes: `b16` is ViT-B/16 at 224 (86 M parameters); `g14` the ViT-g/14 shape (embed 1536,
24 heads, MLP 6144; 40 blocks, ~1.1 B parameters) with its depth cut by `--g14-depth`
(default 40, the whole model; on a CPU machine with little memory use e.g. 12, which the
table states); `tiny` a 2-block embed-64 model for a smoke run.

Scaling ratios (N processes against 1): weak scaling keeps the batch per process (`--batch`)
and reports the throughput ratio divided by N (1.0: perfect); strong scaling keeps the global
batch (`--batch` split over N) and reports the speed-up t1 / tN divided by N. The
communication of one step is computed, not measured, from the parameter count P (ring
algorithms, per process): DDP all-reduces the fp32 gradients, 2 (N-1)/N P x 4 bytes; FSDP
all-gathers the parameters for the forward and again for the backward (b bytes each: 2 with
`--amp bf16`, else 4) and reduce-scatters the fp32 gradients, (N-1)/N P (2 b + 4). Divided
by a link's bandwidth it gives the communication time that overlapping must hide at 8 GPUs
or across nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = {  # name: (registry model, overrides)
    "tiny": ("vit_base_patch16_224", {"img_size": 32, "embed_dim": 64, "depth": 2,
                                      "num_heads": 2}),
    "b16": ("vit_base_patch16_224", {}),
    "g14": ("vit_giant_patch14_224", {}),
}  # fmt: skip


def model_of(size: str, g14_depth: int) -> torch.nn.Module:
    from vitkit import create_model

    name, overrides = SIZES[size]
    if size == "g14":
        overrides = {**overrides, "depth": g14_depth}
    return create_model(name, num_classes=1000, **overrides)


def worker(args: argparse.Namespace) -> None:
    """One process of a launch: train `--steps` steps, write its numbers to `--result`."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from vitkit.train.distributed import init_distributed
    from vitkit.train.sharded import shard

    start_rss = _resident_bytes()
    device = init_distributed(args.device, alone=args.mode == "fsdp")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    torch.manual_seed(0)
    model = model_of(args.size, args.g14_depth).to(device)
    params = sum(p.numel() for p in model.parameters())
    if args.mode == "fsdp":
        shard(model, amp=args.amp, device=torch.device(device))
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    size = (
        model.module.patch_embed.img_size
        if hasattr(model, "module")
        else model.patch_embed.img_size
    )
    images = torch.randn(args.batch, 3, *size, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    dtype = torch.bfloat16 if args.amp == "bf16" else None
    times = []
    for _ in range(args.warmup + args.steps):
        start = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start_rss  # KiB
    row = {"rank": rank, "world": world, "params": params, "peak_bytes": peak,
           "step_s": statistics.median(times[args.warmup:])}  # fmt: skip
    with open(f"{args.result}.{rank}", "w") as f:
        json.dump(row, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def _resident_bytes() -> int:
    """This process's resident set now (Linux; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def launch(args: argparse.Namespace, size: str, procs: int, mode: str, batch: int) -> dict:
    """Run one configuration under torchrun; the ranks' numbers, the slowest rank's time and
    the largest peak."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "row"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={procs}", __file__, "--worker", "--size", size, "--mode", mode,
               "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--g14-depth", str(args.g14_depth), "--device", args.device, "--amp", args.amp,
               "--result", str(result)]  # fmt: skip
        threads = max(1, (os.cpu_count() or 1) // procs) if args.device == "cpu" else 1
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads or threads))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{size} {mode} x{procs} failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(Path(f"{result}.{r}").read_text()) for r in range(procs)]
    gathered = 2 if args.amp == "bf16" else 4  # FSDP's parameter dtype
    per_param = 2 * 4 if mode == "ddp" else 2 * gathered + 4
    return {
        "size": size, "mode": mode, "procs": procs, "batch_per_proc": batch,
        "params": rows[0]["params"], "step_s": max(r["step_s"] for r in rows),
        "peak_gib": max(r["peak_bytes"] for r in rows) / 2**30,
        "comm_mib_per_step": (procs - 1) / procs * rows[0]["params"] * per_param / 2**20,
    }  # fmt: skip


def machine(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} logical CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="b16,g14", help="of tiny, b16, g14 (comma-separated)")
    p.add_argument("--procs", default="1,2", help="process counts (comma-separated)")
    p.add_argument("--modes", default="ddp,fsdp")
    p.add_argument("--batch", type=int, default=8, help="images per process (weak scaling)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--g14-depth", type=int, default=40, help="blocks of the ViT-g/14 shape")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", default="none", choices=("none", "bf16"))
    p.add_argument("--threads", type=int, default=0, help="per process (0: CPUs / processes)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    procs = [int(n) for n in args.procs.split(",")]
    rows = []
    for size in args.sizes.split(","):
        for mode in args.modes.split(","):
            base = None
            for n in procs:
                weak = launch(args, size, n, mode, args.batch)
                base = base or weak
                weak["weak_scaling"] = base["step_s"] / weak["step_s"]  # N x the work in tN
                if n > 1 and args.batch % n == 0:
                    strong = launch(args, size, n, mode, args.batch // n)
                    weak["strong_scaling"] = base["step_s"] / strong["step_s"] / n
                rows.append(weak)
    print(f"# {machine(args.device)}, torch {torch.__version__}, {args.amp}, g14 depth "
          f"{args.g14_depth}, {args.batch} images per process")  # fmt: skip
    print(
        "| model | mode | procs | params | step (s) | peak / process, above start (GiB) "
        "| comm / step (MiB) | weak | strong |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        strong = f"{r['strong_scaling']:.2f}" if "strong_scaling" in r else "-"
        print(f"| {r['size']} | {r['mode']} | {r['procs']} | {r['params'] / 1e6:.1f} M "
              f"| {r['step_s']:.3f} | {r['peak_gib']:.2f} | {r['comm_mib_per_step']:.1f} "
              f"| {r['weak_scaling']:.2f} | {strong} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
