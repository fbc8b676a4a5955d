"""The benchmark scripts run end to end (their numbers are reported, never asserted)."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import torch

from _helpers import run_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_throughput_script_writes_both_implementations(tmp_path):
    pytest.importorskip("timm", reason="timm is not installed (pip install -e '.[interop]')")
    out = tmp_path / "bench.json"
    args = [
        "--models", "vit_tiny_patch16_224", "--batch-sizes", "2", "--repeats", "3",
        "--warmup", "0", "--grad-ckpt-model", "", "--scaling-model", "", "--json", str(out),
    ]  # fmt: skip
    proc = run_benchmark("throughput.py", *args, timeout=600)
    report = json.loads(out.read_text())
    assert [(r["model"], r["mode"]) for r in report["results"]] == [
        ("vit_tiny_patch16_224", "infer"),
        ("vit_tiny_patch16_224", "train"),
    ]
    for row in report["results"]:
        assert row["max_abs_diff_vs_timm"] < 1e-4  # the same weights give the same logits
        assert row["flops_per_batch"] > 0
        ours, mm_rates = row["vitkit"], row["matmul_gflops_per_round"]
        assert len(ours["seconds"]) == len(mm_rates) == 3
        per_round = [
            row["flops_per_batch"] / 1e9 / t / mm for t, mm in zip(ours["seconds"], mm_rates)
        ]
        assert ours["fraction_of_matmul"] == pytest.approx(statistics.median(per_round))
        assert row["matmul_gflops"] == pytest.approx(statistics.median(mm_rates))
    assert "| vit_tiny_patch16_224 | 2 | fp32 | off | infer |" in proc.stdout


def test_loader_benchmark_times_the_loader_and_the_model(tmp_path):
    out = tmp_path / "loader.json"
    args = ["--data", "digits", "--batches", "2", "--rounds", "1", "--json", str(out)]
    proc = run_benchmark("loader.py", *args)
    report = json.loads(out.read_text())
    assert (report["data"], report["model"], report["batch_size"]) == ("digits", "vit_digits", 64)
    assert report["loader_images_per_s"] > 0 and report["model_train_images_per_s"] > 0
    ratio = report["loader_images_per_s"] / report["model_train_images_per_s"]
    assert report["ratio"] == pytest.approx(ratio)
    assert f"the loader is {report['ratio']:.1f}x the model" in proc.stdout


@pytest.mark.slow
def test_gpu_numerics_checks_pass_on_the_cpu():
    proc = run_benchmark("gpu_numerics.py", "--device", "cpu", timeout=900)
    lines = proc.stdout.splitlines()
    assert lines[-1] == "all checks passed"
    assert sum(line.startswith("ok ") for line in lines) >= 5


def load_throughput_script():
    path = ROOT / "benchmarks" / "throughput.py"
    spec = importlib.util.spec_from_file_location("throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_matmul_ceiling_runs_in_every_dtype(dtype):
    throughput = load_throughput_script()
    steps = throughput.matmul_steps(torch.device("cpu"), dtype, 16)
    assert ("onednn.mm" in steps) == throughput.onednn_has_kernels(dtype)
    assert (dtype == torch.float32) <= ("onednn.mm" in steps)  # float32 always has oneDNN's
    for step in steps.values():
        assert step().dtype == dtype
