"""benchmarks/serve.py runs end to end (its numbers are reported, never asserted): the plain
endpoint, vitkit's workers, the model alone, the memory and the goals' ratios."""

from __future__ import annotations

import json

import pytest

from _helpers import run_benchmark

pytestmark = pytest.mark.requires(
    "starlette", "uvicorn", "multipart", "httpx", "prometheus_client", extra="serve"
)


def _run(tmp_path, workers: str, clients: str) -> tuple[dict, str]:
    out = tmp_path / "serve.json"
    args = ["--model", "vit_digits", "--clients", clients, "--requests", "4", "--image-size",
            "24", "--max-batch", "2", "--workers", workers, "--json", str(out)]  # fmt: skip
    proc = run_benchmark("serve.py", *args, timeout=600)
    return json.loads(out.read_text()), proc.stdout


def test_serve_benchmark_smoke(tmp_path):
    report, stdout = _run(tmp_path, "1", "1,2")
    rounds = [(row["server"], row["clients"]) for row in report["serve"]]
    assert rounds == [("plain endpoint", 1), ("plain endpoint", 2), ("vitkit, 1 worker", 1),
                      ("vitkit, 1 worker", 2)]  # fmt: skip
    assert all(row["requests_per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
               and row["peak_mib"] > 10 for row in report["serve"])  # fmt: skip
    assert set(report["model_alone"]) == {"batch 2", "batch 1", "batch 2, decode + prepare",
                                          "one image ms"}  # fmt: skip
    assert set(report["ratios"]) == {"vitkit, 1 worker, 1 client: request path ms"}
    assert report["environment"]["cpu"] and "| vitkit, 1 worker | 2 |" in stdout


@pytest.mark.slow
def test_serve_benchmark_reports_the_goals_with_two_workers(tmp_path):
    report, stdout = _run(tmp_path, "1,2", "1,32,64")
    assert {row["server"] for row in report["serve"]} == {
        "plain endpoint", "vitkit, 1 worker", "vitkit, 2 workers"}  # fmt: skip
    for server in ("vitkit, 1 worker", "vitkit, 2 workers"):
        assert f"{server}, 32 clients / plain endpoint" in report["ratios"]
        assert f"{server}, 64 clients / model batched" in report["ratios"]
    assert "| vitkit, 2 workers | 64 |" in stdout
