"""benchmarks/serve.py runs end to end (its numbers are reported, never asserted)."""

from __future__ import annotations

import json

import pytest

from _helpers import run_benchmark

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")


@pytest.mark.slow
def test_serve_benchmark_reports_every_round(tmp_path):
    out = tmp_path / "serve.json"
    args = ["--model", "vit_digits", "--clients", "1,3", "--requests", "6", "--image-size", "24",
            "--max-batch", "4", "--json", str(out)]  # fmt: skip
    proc = run_benchmark("serve.py", *args, timeout=600)
    report = json.loads(out.read_text())
    rounds = [(row["mode"], row["clients"]) for row in report["serve"]]
    assert rounds == [("batching on", 1), ("batching on", 3), ("batching off", 1),
                      ("batching off", 3)]  # fmt: skip
    assert all(row["requests_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
               for row in report["serve"])  # fmt: skip
    assert set(report["serve"][-1]["batch_sizes"]) == {"1"}  # batching off: one image a pass
    assert set(report["plain_loop"]) == {"batch 1", "batch 4"} and report["environment"]["cpu"]
    assert "| batching on | 3 |" in proc.stdout
