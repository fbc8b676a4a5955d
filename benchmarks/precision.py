"""Lower precision on CPU, side by side in one run: vitkit fp32 / bf16 / int8, timm fp32 (and
bf16 autocast), onnxruntime fp32 / int8 (vitkit's ONNX export), plus the training step against
timm, with the accuracy each precision keeps.

    python benchmarks/precision.py                         # ViT-S/16 and ViT-B/16, batch 1 and 32
    python benchmarks/precision.py --checkpoint runs/fashion-mnist/model.safetensors \\
        --data-dir /usr/share/datasets/fashion-mnist       # + top-1 agreement on its test set
    python benchmarks/precision.py --help

Every implementation runs the same weights (timm's model gets vitkit's state dict; the ONNX
files are exported from vitkit's model), alternating round by round in one process (ABBA
order), so a slow spell of a shared machine slows all alike; medians of the timed rounds,
warm-up excluded, and ratios as medians of per-round ratios. bf16 rows run only where the CPU
multiplies bf16 natively (AVX-512 BF16 / AMX, as oneDNN reports); elsewhere they say so.

Accuracy: top-1 agreement with vitkit fp32 (and each one's accuracy) on a trained checkpoint's
test images (`--checkpoint`, Fashion-MNIST idx files in `--data-dir`), and on the benchmarked
ViTs, whose weights are random (nothing is downloaded), over `--agreement-images` random
images: random weights leave near-ties, so that figure is a pessimistic one, shown with the
largest logit error relative to the largest logit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  (the sibling script: timing and environment helpers)
from throughput import alternate, csv, environment, infer_step  # noqa: E402

vitkit = throughput.vitkit
timm = throughput.timm
from vitkit.model.precision import native_bf16, quantize_int8  # noqa: E402

try:
    import onnxruntime

    from vitkit.export import export_onnx
except ImportError:
    onnxruntime = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="vitkit fp32 / bf16 / int8 vs timm and onnxruntime, and the training step",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", default="vit_small_patch16_224,vit_base_patch16_224")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--train-batch", type=int, default=32, help="training step batch (0: skip)")
    p.add_argument("--train-repeats", type=int, default=3)
    p.add_argument(
        "--profile",
        action="store_true",
        help="print profiles of vitkit's steps (fp32, int8, training)",
    )
    p.add_argument("--agreement-images", type=int, default=64)
    p.add_argument("--checkpoint", help="a trained vitkit checkpoint (Fashion-MNIST)")
    p.add_argument("--data-dir", help="the folder of its idx test files (t10k-*)")
    p.add_argument("--no-timm", action="store_true", help="measure without timm")
    p.add_argument("--no-onnx", action="store_true", help="measure without onnxruntime")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def autocast_bf16() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def ort_session(path: Path, threads: int):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_step(session, x: torch.Tensor) -> Callable[[], object]:
    feed = {"image": x.numpy()}
    return lambda: session.run(None, feed)


def autocast_step(model: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    def step():
        with torch.inference_mode(), autocast_bf16():
            model(x)

    return step


def build(name: str, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    """Every implementation of `name`, on vitkit's weights: modules, or ONNX sessions."""
    fp32 = vitkit.create_model(name).eval()
    impls: dict[str, object] = {"vitkit fp32": fp32}
    if native_bf16():
        bf16 = vitkit.create_model(name).eval()
        bf16.load_state_dict(fp32.state_dict())
        impls["vitkit bf16"] = bf16.to(torch.bfloat16)
        impls["vitkit bf16 autocast"] = fp32  # the same module, under autocast
    int8 = vitkit.create_model(name).eval()
    int8.load_state_dict(fp32.state_dict())
    impls["vitkit int8"] = quantize_int8(int8)
    if timm is not None and not args.no_timm:
        theirs = timm.create_model(name, pretrained=False).eval()
        theirs.load_state_dict(fp32.state_dict())
        impls["timm fp32"] = theirs
        if native_bf16():
            impls["timm bf16 autocast"] = theirs
    if onnxruntime is not None and not args.no_onnx:
        for precision in ("fp32", "int8"):
            path = folder / f"{name}-{precision}.onnx"
            try:
                export_onnx(fp32, path, precision=precision)
            except Exception as err:  # noqa: BLE001 - report it, measure the rest
                print(f"{name}: onnxruntime {precision} left out: {err}", flush=True)
                continue
            impls[f"onnxruntime {precision}"] = ort_session(path, args.threads)
    return impls


def step_for(label: str, impl: object, x: torch.Tensor) -> Callable[[], object]:
    if label.startswith("onnxruntime"):
        return ort_step(impl, x)
    if label.endswith("autocast"):
        return autocast_step(impl, x)
    return infer_step(impl, x)


def logits_of(label: str, impl: object, x: torch.Tensor) -> torch.Tensor:
    if label.startswith("onnxruntime"):
        return torch.from_numpy(impl.run(None, {"image": x.numpy()})[0])
    context = autocast_bf16() if label.endswith("autocast") else contextlib.nullcontext()
    with torch.inference_mode(), context:
        return impl(x).float()


def agreement(impls: dict[str, object], x: torch.Tensor, labels=None) -> dict[str, dict]:
    """Top-1 agreement with vitkit fp32 (and accuracy, given labels), in batches of 64."""
    outs = {k: torch.cat([logits_of(k, v, part) for part in x.split(64)]) for k, v in impls.items()}
    want = outs["vitkit fp32"]
    result = {}
    for label, got in outs.items():
        row = {
            "agreement": (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
            "max_rel_error": ((got - want).abs().max() / want.abs().max()).item(),
        }
        if labels is not None:
            row["accuracy"] = (got.argmax(-1) == labels).float().mean().item()
        result[label] = row
    return result


# Each vitkit precision against the other library's same precision (the targets).
LIKE_FOR_LIKE = {
    "vitkit fp32": "onnxruntime fp32",
    "vitkit bf16": "timm bf16 autocast",
    "vitkit bf16 autocast": "timm bf16 autocast",
    "vitkit int8": "onnxruntime int8",
}


def speed_case(name: str, batch: int, impls: dict[str, object], args) -> dict[str, dict]:
    size = impls["vitkit fp32"].patch_embed.img_size
    x = torch.randn(batch, 3, *size)
    steps = {label: step_for(label, impl, x) for label, impl in impls.items()}
    times = alternate(steps, args, torch.device("cpu"))
    if args.profile:
        for label in ("vitkit fp32", "vitkit int8"):
            print_profile(f"{name} batch {batch} inference, {label}", steps[label])
    out = {k: {"images_per_s": batch / statistics.median(v)} for k, v in times.items()}
    for base in ("vitkit fp32", "timm fp32", "onnxruntime fp32", *LIKE_FOR_LIKE.values()):
        if base in times:
            for label, seconds in times.items():
                ratios = [b / s for s, b in zip(seconds, times[base])]
                out[label][f"vs {base}"] = statistics.median(ratios)
    return out


def print_profile(what: str, step: Callable[[], object]) -> None:
    """The operators of one step, by their own CPU time."""
    with torch.profiler.profile() as prof:
        step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    print(f"{what}, by operator:\n{table}", flush=True)


def optimiser_step(model: nn.Module, optimizer, x: torch.Tensor) -> Callable[[], object]:
    """One forward, backward and AdamW step (float32)."""
    target = torch.randint(0, 1000, (x.shape[0],))

    def step():
        F.cross_entropy(model(x), target).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def train_case(name: str, args) -> dict | None:
    """A training step, vitkit against timm, each with its own library's AdamW as its users
    get it (vitkit's `build_optimizer`, timm's `create_optimizer_v2`; weight decay 0.05)."""
    if timm is None or args.no_timm or not args.train_batch:
        return None
    from timm.optim import create_optimizer_v2

    from vitkit.train.optim import build_optimizer

    ours = vitkit.create_model(name).train()
    theirs = timm.create_model(name, pretrained=False).train()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(args.train_batch, 3, *ours.patch_embed.img_size)
    steps = {
        "vitkit": optimiser_step(ours, build_optimizer(ours, 1e-4, 0.05), x),
        "timm": optimiser_step(theirs, create_optimizer_v2(theirs, "adamw", 1e-4, 0.05), x),
    }
    rounds = argparse.Namespace(warmup=1, repeats=args.train_repeats)
    cpu = torch.device("cpu")
    times = alternate(steps, rounds, cpu)
    if args.profile:
        print_profile(f"{name} training step, vitkit", steps["vitkit"])
    return {
        "batch": args.train_batch,
        "vitkit_images_per_s": args.train_batch / statistics.median(times["vitkit"]),
        "timm_images_per_s": args.train_batch / statistics.median(times["timm"]),
        "speedup_vs_timm": statistics.median(
            [t / v for v, t in zip(times["vitkit"], times["timm"])]
        ),
    }


def fashion_agreement(args, folder: Path) -> dict | None:
    """Agreement on a trained checkpoint's test set (28x28 idx files)."""
    if not args.checkpoint:
        return None
    from vitkit.data.idx import load_idx_split

    model = vitkit.load(args.checkpoint).eval()
    images, labels = load_idx_split(args.data_dir, "test", "fashion-mnist")
    config = model.data_config
    x = images.float().div(255).unsqueeze(1)  # (N, 1, 28, 28)
    if tuple(x.shape[-2:]) != tuple(config.img_size):
        x = F.interpolate(x, size=config.img_size, mode="bilinear", antialias=True)
    mean = torch.tensor(config.mean).view(1, -1, 1, 1)
    std = torch.tensor(config.std).view(1, -1, 1, 1)
    x = (x - mean) / std
    impls: dict[str, object] = {"vitkit fp32": model}
    if native_bf16():
        twin = vitkit.load(args.checkpoint).eval()
        impls["vitkit bf16"] = twin.to(torch.bfloat16)
        impls["vitkit bf16 autocast"] = model
    impls["vitkit int8"] = quantize_int8(vitkit.load(args.checkpoint).eval())
    if onnxruntime is not None and not args.no_onnx:
        path = folder / "checkpoint-int8.onnx"
        export_onnx(model, path, precision="int8")
        impls["onnxruntime int8"] = ort_session(path, args.threads)
    return {"images": len(x), **agreement(impls, x, labels)}


def render(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"CPU: {env['cpu']} ({env['cpu_capability']}, native bf16: {report['native_bf16']}), "
        f"{env['threads']} threads, torch {env['torch']}, timm {env['timm']}, "
        f"onnxruntime {report['onnxruntime']}, {env['date']}",
        "",
        "| model | batch | implementation | img/s | vs vitkit fp32 | vs timm fp32 | vs ORT fp32 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for case in report["speed"]:
        for label, row in case["results"].items():
            cells = [
                f"{row.get(f'vs {b}', float('nan')):.2f}x"
                for b in ("vitkit fp32", "timm fp32", "onnxruntime fp32")
            ]
            lines.append(
                f"| {case['model']} | {case['batch']} | {label} | "
                f"{row['images_per_s']:.1f} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        "| model | batch | like for like (median of per-round ratios) | ratio |",
        "|---|---:|---|---:|",
    ]
    for case in report["speed"]:
        for label, base in LIKE_FOR_LIKE.items():
            ratio = case["results"].get(label, {}).get(f"vs {base}")
            if ratio is not None:
                lines.append(
                    f"| {case['model']} | {case['batch']} | {label} / {base} | {ratio:.2f}x |"
                )
    if report["train"]:
        lines += [
            "",
            "| model | training step, batch | vitkit img/s | timm img/s | vs timm |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, row in report["train"].items():
            lines.append(
                f"| {name} | {row['batch']} | {row['vitkit_images_per_s']:.2f} | "
                f"{row['timm_images_per_s']:.2f} | {row['speedup_vs_timm']:.2f}x |"
            )
    lines += [
        "",
        "| images | implementation | top-1 agreement with fp32 | max rel. logit error | accuracy |",
        "|---|---|---:|---:|---:|",
    ]
    for what, rows in report["agreement"].items():
        for label, row in rows.items():
            if label == "images":
                continue
            acc = f"{row['accuracy']:.4f}" if "accuracy" in row else "-"
            lines.append(
                f"| {what} ({rows['images']}) | {label} | {row['agreement']:.4f} | "
                f"{row['max_rel_error']:.2e} | {acc} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = {
        "environment": environment(torch.device("cpu"), args),
        "native_bf16": native_bf16(),
        "onnxruntime": getattr(onnxruntime, "__version__", None),
        "speed": [],
        "train": {},
        "agreement": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in csv(args.models):
            impls = build(name, args, folder)
            for batch in map(int, csv(args.batch_sizes)):
                results = speed_case(name, batch, impls, args)
                report["speed"].append({"model": name, "batch": batch, "results": results})
                save(report, args.json)  # as it goes: a run cut short keeps what it measured
                print(
                    f"{name} batch {batch}: "
                    + ", ".join(f"{k} {v['images_per_s']:.1f}" for k, v in results.items()),
                    flush=True,
                )
            x = torch.randn(args.agreement_images, 3, *impls["vitkit fp32"].patch_embed.img_size)
            report["agreement"][f"{name}, random weights"] = {
                "images": len(x),
                **agreement(impls, x),
            }
            train = train_case(name, args)
            if train:
                report["train"][name] = train
                print(f"{name} training: {train['speedup_vs_timm']:.2f}x timm", flush=True)
        fashion = fashion_agreement(args, folder)
        if fashion:
            report["agreement"]["Fashion-MNIST test, trained checkpoint"] = fashion
    print(render(report))
    save(report, args.json)
    return 0


def save(report: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
