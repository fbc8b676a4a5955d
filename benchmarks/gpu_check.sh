#!/usr/bin/env bash
# Every GPU check and benchmark in one run, for a machine with an NVIDIA GPU and PyTorch (and
# timm for the side-by-side numbers); about 10 minutes on one H200. Results in $OUT (default
# gpu-results/): numerics.txt, train.txt, gpu.json and gpu.md (the README's GPU table).
#
#   bash benchmarks/gpu_check.sh                  # DEVICE=cpu QUICK=1 for a dry run on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
device="${DEVICE:-cuda}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
    | tee "$out/numerics.txt"

# 1. The fast paths' numerics on the device.
python3 benchmarks/gpu_numerics.py --device "$device" | tee -a "$out/numerics.txt"

# 2. The training job end to end on the device (the built-in digits; bf16 autocast on a GPU).
run="$(mktemp -d)"
python3 -m vitkit train --device "$device" --epochs 3 --no-progress --out "$run/digits" 2>&1 \
    | tee "$out/train.txt"

# 3. Throughput against timm: bf16, ViT-B/16 at batch 256, compile off and on.
if [ "${QUICK:-0}" = 1 ]; then
    bench=(--models vit_tiny_patch16_224 --batch-sizes 4 --repeats 1 --modes infer
        --grad-ckpt-model "" --scaling-model "")
else
    bench=(--dtypes bf16 --batch-sizes 256 --models vit_base_patch16_224 --compile off,on)
fi
python3 benchmarks/throughput.py --device "$device" "${bench[@]}" --json "$out/gpu.json" \
    | tee "$out/gpu.md"
