"""vitkit's Swin against timm's, side by side on the same weights: inference and a training
step, images/s and the vitkit / timm ratio.

    python benchmarks/swin.py                      # swin_tiny_patch4_window7_224, batch 8, CPU
    python benchmarks/swin.py --help
    python benchmarks/swin.py --smoke              # a narrow model, one round: does it run

timm's model gets vitkit's state dict (the keys are timm's) and the logits are compared before
timing. The two then run alternately, round by round (ABBA order, `throughput.alternate`), so
a noisy machine slows both alike; medians over the timed rounds, the ratio the median of
per-round ratios (`throughput.summarise`). vitkit's V1 window attention is one
`scaled_dot_product_attention` over the windows; timm's runs its explicit softmax unless
TIMM_FUSED_ATTN=2 is set (its 'experimental' fused path), which the report records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py beside this file
from throughput import (  # noqa: E402
    alternate,
    check_same_function,
    environment,
    infer_step,
    summarise,
    timm,
    train_step,
    vitkit,
)

SMOKE = dict(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), img_size=64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="vitkit's Swin vs timm's: images/s of inference and a training step.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="swin_tiny_patch4_window7_224", help="a swin* preset")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--modes", default="infer,train", help="comma-separated: infer, train")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--smoke", action="store_true", help="a narrow 64-pixel model, one round")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    args.no_timm = timm is None
    if args.smoke:
        args.repeats, args.warmup, args.batch_size = 1, 0, 2
    return args


def build_pair(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    """vitkit's model and timm's with the same weights (fp32, eval)."""
    options = SMOKE if args.smoke else {}
    ours = vitkit.create_model(args.model, **options).eval()
    models = {"vitkit": ours}
    if timm is not None:
        theirs = timm.create_model(args.model, pretrained=False, **options).eval()
        theirs.load_state_dict(ours.state_dict())
        models["timm"] = theirs
    return models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    models = {k: m.to(device) for k, m in build_pair(args).items()}
    size = models["vitkit"].patch_embed.img_size
    x = torch.randn(args.batch_size, 3, *size, device=device)
    report = {
        "environment": {
            **environment(device, args),
            "timm_fused_attn": os.environ.get("TIMM_FUSED_ATTN", ""),
        },  # fmt: skip
        "model": args.model if not args.smoke else f"{args.model} (smoke: {SMOKE})",
        "batch_size": args.batch_size,
        "max_abs_diff_vs_timm": check_same_function(models, x),
        "results": {},
    }
    env = report["environment"]
    versions = f"torch {env['torch']}, timm {env['timm']}"
    print(f"{env['cpu']} ({env['cpu_capability']}), {env['threads']} threads, {versions}; "
          f"{report['model']}, batch {args.batch_size}")  # fmt: skip
    for mode in args.modes.split(","):
        if mode == "infer":
            steps = {k: infer_step(m, x) for k, m in models.items()}
        else:
            steps = {k: train_step(m.train(), x, torch.float32, device) for k, m in models.items()}
        result = summarise(alternate(steps, args, device), args.batch_size)
        report["results"][mode] = result
        ratio = result["vitkit"].get("speedup_vs_timm")
        rates = ", ".join(f"{k} {v['images_per_s']:.1f} img/s" for k, v in result.items())
        print(f"{mode:5s}  {rates}" + (f"  vitkit/timm speed {ratio:.2f}x" if ratio else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
