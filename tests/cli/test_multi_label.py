"""A multi-label run from the command line: `vitkit train` on a file list with several labels per
image, `vitkit eval` reporting mAP and each class's AP (equal to scikit-learn's on the model's
own scores), and `vitkit predict` listing the labels over the threshold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from _helpers import colour_list
from vitkit import cli
from vitkit.data import load_data
from vitkit.inference import load_for_inference

COLOURS = ("red", "green", "blue")
TINY = (
    "--model", "vit_digits", "--model-opt", "in_chans=3", "--model-opt", "embed_dim=16",
    "--model-opt", "depth=1", "--model-opt", "num_heads=2", "--batch-size", "8", "--lr", "5e-3",
    "--no-progress",
)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-epoch multi-label run on the colour list, its threshold 0.4."""
    folder = tmp_path_factory.mktemp("multi")
    data = colour_list(folder / "data", seed=1)
    argv = ["train", "--data", f"list:{data}", "--epochs", "2", "--threshold", "0.4", *TINY]
    assert cli.main([*argv, "--out", str(folder / "run")]) == 0
    return folder / "run"


def _scores(checkpoint: Path) -> tuple[np.ndarray, np.ndarray]:
    """The sigmoid scores of the test split training cut, and its multi-hot targets."""
    predictor = load_for_inference(checkpoint)
    spec = predictor.model.meta["data"]
    test = load_data(spec, in_chans=3).test
    images, targets = [], []
    for i in range(len(test)):
        path, labels = test.samples[i]
        with Image.open(path) as image:
            images.append(predictor.prepare(image.convert("RGB")))
        targets.append(test[i][1])
    with torch.no_grad():
        logits = predictor.model(torch.stack(images))
    return torch.sigmoid(logits).numpy(), torch.stack(targets).numpy()


def test_eval_reports_map_and_each_classs_ap_as_sklearn(run, run_cli):
    from sklearn.metrics import average_precision_score

    code, out, _ = run_cli("eval", "--checkpoint", run / "model.safetensors", "--json")
    assert code == 0
    row = json.loads(out)
    probs, targets = _scores(run / "model.safetensors")
    assert row["count"] == len(targets) == 10 and row["threshold"] == 0.4
    assert row["map"] == pytest.approx(average_precision_score(targets, probs, average="macro"))
    expected = average_precision_score(targets, probs, average=None)
    assert [c["class"] for c in row["per_class"]] == ["blue", "green", "red"]
    assert [c["ap"] for c in row["per_class"]] == pytest.approx(expected.tolist())
    assert [c["support"] for c in row["per_class"]] == targets.sum(0).astype(int).tolist()
    test = json.loads((run / "test.json").read_text())
    assert row["map"] == pytest.approx(test["test_map"]) and "acc1" not in row
    code, out, _ = run_cli("eval", "--checkpoint", run / "model.safetensors", "--threshold", "0.9")
    assert code == 0
    assert f"mAP {row['map']:.4f}" in out and "at threshold 0.9" in out
    assert out.splitlines()[2].split() == ["class", "AP", "precision", "recall", "F1", "support"]


def test_predict_lists_the_labels_over_the_threshold(run, run_cli, caplog):
    checkpoint = run / "model.safetensors"
    predictor = load_for_inference(checkpoint)
    files = sorted((run.parent / "data" / "img").glob("*.png"))[:6]
    with torch.no_grad():
        batch = torch.stack([predictor.prepare(Image.open(f).convert("RGB")) for f in files])
        probs = torch.sigmoid(predictor.model(batch))
    for threshold, flags in ((0.4, ()), (0.55, ("--threshold", "0.55"))):
        code, out, _ = run_cli("predict", "--checkpoint", checkpoint, *files, "--json", *flags)
        assert code == 0
        for row, p in zip(json.loads(out), probs.tolist()):
            want = sorted((q, i) for i, q in enumerate(p) if q >= threshold)[::-1]
            assert [lb["index"] for lb in row["labels"]] == [i for _, i in want]
            assert [lb["probability"] for lb in row["labels"]] == [round(q, 6) for q, _ in want]
            assert row["threshold"] == threshold and "predictions" not in row
    code, out, _ = run_cli("predict", "--checkpoint", checkpoint, files[0], "--threshold", "1",
                           "--topk", "2")  # fmt: skip
    assert (code, out) == (0, f"{files[0]}: no class reaches 1.0\n")
    assert "--topk: a multi-label model lists the labels over its threshold" in caplog.text


def test_multi_label_forced_on_single_labels_trains_one_vs_rest(tmp_path, run_cli):
    rows = ["path,label"]
    (tmp_path / "img").mkdir()
    rng = np.random.default_rng(2)
    for i in range(24):
        pixels = rng.integers(0, 40, (8, 8, 3)) + 20
        pixels[..., i % 3] += 160
        Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,{COLOURS[i % 3]}")
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    argv = ["train", "--data", f"list:{tmp_path / 'train.csv'}", "--epochs", "1", *TINY]
    code, out, _ = run_cli(*argv, "--multi-label", "--out", tmp_path / "run")
    assert code == 0 and "best val mAP" in out and "test mAP" in out
    assert load_for_inference(tmp_path / "run" / "model.safetensors").multi_label


def test_threshold_on_single_labels_is_said_to_not_apply(tmp_path, run_cli, caplog):
    rows = ["path,label"]
    (tmp_path / "img").mkdir()
    for i in range(30):
        Image.fromarray(np.full((8, 8, 3), 40 * (i % 3), np.uint8)).save(
            tmp_path / "img" / f"{i}.png"
        )
        rows.append(f"img/{i}.png,{COLOURS[i % 3]}")
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    argv = ["train", "--data", f"list:{tmp_path / 'train.csv'}", "--epochs", "1", *TINY]
    code, _, _ = run_cli(*argv, "--threshold", "0.3", "--out", tmp_path / "run")
    assert code == 0
    assert (
        "--threshold 0.3 applies to multi-label models; this data has one label per image "
        "(--multi-label trains one-vs-rest)"
    ) in caplog.text
