"""benchmarks/loader.py --jpegs runs end to end and its worker estimate follows from its rates;
--start-up makes its folder of hard links and times each part of the start (the rates and
times themselves are reported, never asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from _helpers import run_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _loader_script():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports its neighbour throughput.py
    try:
        spec = importlib.util.spec_from_file_location(
            "loader_bench", ROOT / "benchmarks" / "loader.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.slow
def test_the_jpeg_benchmark_reports_every_pipeline_against_every_model(tmp_path):
    out = tmp_path / "loader.json"
    args = [
        "--jpegs", "2", "--jpeg-size", "480x360", "--rounds", "1", "--threads", "1",
        "--models", "vit_tiny_patch16_224", "--train-batch", "2", "--json", str(out),
    ]  # fmt: skip
    proc = run_benchmark("loader.py", *args)
    report = json.loads(out.read_text())
    pipes = ["train, draft off", "eval, draft off", "train, draft on", "eval, draft on"]
    assert list(report["worker_images_per_s"]) == pipes
    models = list(report["model_train_images_per_s"])
    assert models[0] == "vit_tiny_patch16_224 fp32" and len(models) in (1, 2)  # + bf16
    assert [(c["pipeline"], c["model"]) for c in report["comparisons"]] == [
        (p, m) for p in pipes for m in models
    ]
    module = _loader_script()  # the worker estimate: one core each, training on the rest
    # a worker at 30 images/s, training at 10 images/s per core: 1 worker + 1 core = 30 >= 10
    assert module.workers_needed(30.0, 10.0, 2) == 1
    assert module.workers_needed(30.0, 10.0, 16) == 4  # w * 30 >= (16 - w) * 10 -> w >= 4
    assert module.workers_needed(10.0, 10.0, 16) == 8  # as fast as a core: half the machine
    assert module.workers_needed(1.0, 100.0, 2) == 2  # decoding cannot keep up on 2 cores
    for c in report["comparisons"]:
        worker = report["worker_images_per_s"][c["pipeline"]]
        per_core = report["model_train_images_per_s"][c["model"]] / report["env"]["threads"]
        assert c["workers"] == {str(n): module.workers_needed(worker, per_core, n) for n in (2, 16)}
    assert report["env"]["cpu"] and "cpu_flags" in report["env"]
    assert "| eval, draft on | vit_tiny_patch16_224 fp32 |" in proc.stdout


def test_the_start_up_folder_is_hard_links_to_a_few_jpegs(tmp_path):
    module = _loader_script()
    jpegs = [tmp_path / f"{i}.jpg" for i in range(3)]
    for i, path in enumerate(jpegs):
        module.photo(i, 32, 24).save(path, quality=90)
    module.link_folder(tmp_path / "folder", 25, jpegs)
    classes = sorted((tmp_path / "folder").iterdir())
    assert [c.name for c in classes] == [f"class{c}" for c in range(10)]
    assert sorted(len(list(c.iterdir())) for c in classes) == [2] * 5 + [3] * 5
    assert [path.stat().st_nlink for path in jpegs] == [1 + 9, 1 + 8, 1 + 8]  # 25 in turn
    linked = tmp_path / "folder" / "class4" / "0000004.jpg"
    assert linked.samefile(jpegs[1])


@pytest.mark.parametrize("limit, screened", [(100, True), (30, False)])
def test_the_start_up_benchmark_times_each_part(tmp_path, capsys, monkeypatch, limit, screened):
    from vitkit.data import folders

    module = _loader_script()
    monkeypatch.setattr(folders, "SCREEN_LIMIT", limit)
    read = []
    headers = folders.unreadable_images
    monkeypatch.setattr(
        folders, "unreadable_images", lambda paths: read.extend(paths) or headers(paths)
    )
    out = tmp_path / "start.json"
    args = ["--start-up", "40", "--jpeg-size", "64x48", "--img-size", "32", "--train-batch", "4",
            "--json", str(out)]  # fmt: skip
    assert module.main(args) == 0
    report = json.loads(out.read_text())
    assert (report["files"], report["jpegs"]["count"], report["screened"]) == (40, 10, screened)
    assert len(read) == (40 if screened else 0)
    assert list(report["seconds"]) == ["listing", "dataset", "first_batch"]
    assert all(seconds > 0 for seconds in report["seconds"].values())
    printed = capsys.readouterr().out
    assert report["env"]["cpu"] in printed.splitlines()[0]
    assert "a folder of 40 files (10 class folders, hard links to 10 JPEGs of 64x48" in printed
    assert ("headers read" if screened else "listed only") in printed
    assert "start-up: building + first batch" in printed
