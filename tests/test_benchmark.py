"""The benchmark script runs end to end (its numbers are reported, never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_throughput_script_writes_both_implementations(tmp_path):
    pytest.importorskip("timm", reason="timm is not installed (pip install -e '.[interop]')")
    out = tmp_path / "bench.json"
    args = [
        "--models", "vit_tiny_patch16_224", "--batch-sizes", "2", "--repeats", "1",
        "--warmup", "0", "--grad-ckpt-model", "", "--scaling-model", "", "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(r["model"], r["mode"]) for r in report["results"]] == [
        ("vit_tiny_patch16_224", "infer"),
        ("vit_tiny_patch16_224", "train"),
    ]
    for row in report["results"]:
        assert row["max_abs_diff_vs_timm"] < 1e-4  # the same weights give the same logits
        assert row["flops_per_batch"] > 0
    assert "| vit_tiny_patch16_224 | 2 | fp32 | off | infer |" in proc.stdout
