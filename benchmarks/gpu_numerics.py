"""The fast paths' numerics on an accelerator: what the CPU test suite checks, on CUDA.

    python benchmarks/gpu_numerics.py                 # cuda
    python benchmarks/gpu_numerics.py --device cpu    # the same checks on the CPU

Each check prints its worst difference and tolerance; the exit status is 1 if any fails.
Tolerances: float32 1e-4 (GPU kernels sum in other orders, TF32 off), bfloat16 5e-2 relative
to the output's scale, gradients of checkpointed blocks 1e-5.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import vitkit
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import vitkit

try:
    import timm
except ImportError:
    timm = None

FAILED: list[str] = []


def check(name: str, diff: float, tol: float) -> None:
    ok = diff <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max |diff| {diff:.3g} (tolerance {tol:g})")
    if not ok:
        FAILED.append(name)


def scaled_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    name = "vit_small_patch16_224"
    model = vitkit.create_model(name).to(device).eval()
    x = torch.randn(4, 3, 224, 224, device=device)
    with torch.no_grad():
        ref = model(x)

        # SDPA (flash / memory-efficient on GPU) against the explicit softmax path.
        for block in model.blocks:
            block.attn.fused_attn = False
        check("SDPA vs explicit attention, fp32", (model(x) - ref).abs().max().item(), 1e-4)
        for block in model.blocks:
            block.attn.fused_attn = True

        # bfloat16 weights and input against float32.
        low = vitkit.create_model(name).to(device).eval()
        low.load_state_dict(model.state_dict())
        low = low.to(torch.bfloat16)
        check("bf16 model vs fp32", scaled_diff(low(x.bfloat16()), ref), 5e-2)

        # timm on the same weights.
        if timm is not None:
            theirs = timm.create_model(name, pretrained=False).to(device).eval()
            theirs.load_state_dict(model.state_dict())
            check("vitkit vs timm, fp32", (theirs(x) - ref).abs().max().item(), 1e-4)
        else:
            print("skip vitkit vs timm (timm is not installed)")

    # Training steps: bf16 autocast and fp16 with a gradient scaler give finite, close losses.
    model.train()
    target = torch.randint(0, 1000, (4,), device=device)
    loss32 = F.cross_entropy(model(x), target)
    for dtype in (torch.bfloat16, torch.float16):
        if dtype == torch.float16 and device.type != "cuda":
            continue
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(model(x), target)
        check(f"{dtype} autocast loss vs fp32", abs(loss.item() - loss32.item()), 5e-2)

    # Gradient checkpointing: the same gradients.
    model.zero_grad()
    F.cross_entropy(model(x), target).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    F.cross_entropy(model(x), target).backward()
    worst = max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), plain))
    check("gradient checkpointing gradients", worst, 1e-5)
    model.set_grad_checkpointing(False)

    # torch.compile without graph breaks.
    model.eval()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        worst = (compiled(x) - ref).abs().max().item()
    check("torch.compile(fullgraph=True) vs eager", worst, 1e-4)

    print(f"{len(FAILED)} failed" if FAILED else "all checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
