"""Helpers shared by the test suite: randomised weights for equivalence tests, and skips that
name the package a test needs (per test, never a whole file)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter by N(0, 0.05) so that no zero-initialised bias or head, unit
    norm or tiny LayerScale hides a mistake in an equivalence test; returns the model in eval
    mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


# Skipped where a package is missing: tests/conftest.py reads the `requires` marker when the
# tests are collected (after `--without` has blocked packages) and skips with the reason
# "missing package NAME: pip install -e '.[EXTRA]'", which VITKIT_CI=1 turns into a failure.
requires_timm = pytest.mark.requires("timm", extra="interop")
requires_transformers = pytest.mark.requires("transformers", extra="interop")
requires_torchvision = pytest.mark.requires("torchvision", extra="interop")
requires_torchinfo = pytest.mark.requires("torchinfo", extra="test")
requires_onnx = pytest.mark.requires("onnx", "onnxscript", "onnxruntime", extra="onnx")


class _Absent:
    """Stands for a package that is not installed: its attributes are stand-ins too, so a
    test file's module-level table of the package's classes still builds; calling one raises.
    The tests that use it carry the package's requires_* marker and are skipped."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError(
            f"{self._name} is not installed; a test that uses it needs its requires_* marker"
        )


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights no init hides a mistake behind (a Swin's especially): norm scales in
    [0.5, 1.5], logit scales in [0, 5] (some past the clamp at log 100), everything else
    moved by N(0, 0.05); returns the model in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "logit_scale" in name:
                param.copy_(torch.rand(param.shape, generator=gen) * 5)
            elif "norm" in name and name.endswith("weight"):
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            else:
                param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model.eval()


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs|, the shapes checked equal first."""
    assert ours.shape == theirs.shape
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def top1_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """The fraction of rows whose largest logit is at the same index in `a` and `b`."""
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `benchmarks/<script>` with `args` on this checkout's vitkit and check it exits 0
    (the message: the end of its output); returns the finished process."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def torchrun(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc_per_node=2 ARGS` on this checkout's
    sources, one torch thread a process (gloo on CPU), output captured."""
    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", *args]  # fmt: skip
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def optional_import(name: str) -> ModuleType | Any:
    """`importlib.import_module(name)`, or a stand-in where the package is not installed (so
    that one missing package skips the tests that need it, not the whole file)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return _Absent(name)


def _requires_onednn() -> pytest.MarkDecorator:
    from vitkit.model.onednn_support import unsupported_reason

    reason = unsupported_reason()
    return pytest.mark.skipif(bool(reason), reason=f"no oneDNN fast path here: {reason}")


# Where this torch build cannot run the oneDNN fast path: skipped, with the reason.
requires_onednn = _requires_onednn()


def digits_subsets(train: int, val: int):
    """The first `train` training and `val` validation digits, normalised with the split's
    mean and std: (train set, val set) for `fit` without transforms."""
    from vitkit.data import Subset, Transformed, load_data

    splits = load_data("digits", seed=0)
    mean, std = torch.tensor(splits.mean).view(-1, 1, 1), torch.tensor(splits.std).view(-1, 1, 1)

    def norm(x):
        return (x - mean) / std

    return (
        Transformed(Subset(splits.train, range(train)), norm),
        Transformed(Subset(splits.val, range(val)), norm),
    )


class FixedLogits(torch.nn.Module):
    """A classifier whose logits are row `x[:, 0, 0, 0]` of `table`: exact metrics to check
    `evaluate` against."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0, 0, 0].long()]


def write_jax_npz(model: Any, path: Any, prefix: str = "") -> None:
    """Write a model's weights in the layout of google-research/vision_transformer."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    dim, heads = model.embed_dim, model.config.num_heads
    hd = dim // heads
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (ph, pw, C, D)
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    if "cls_token" in sd:
        out["cls"] = sd["cls_token"]
    for i in range(model.config.depth):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = p + "MultiHeadDotProductAttention_1/"
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3)  # each (D_out, D_in)
        qb, kb, vb = np.split(sd[b + "attn.qkv.bias"], 3)
        for name, w, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            out[f"{mha}{name}/kernel"] = w.T.reshape(dim, heads, hd)
            out[f"{mha}{name}/bias"] = bias.reshape(heads, hd)
        out[mha + "out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(heads, hd, dim)
        out[mha + "out/bias"] = sd[b + "attn.proj.bias"]
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            out[f"{p}{theirs}/scale"] = sd[f"{b}{ours}.weight"]
            out[f"{p}{theirs}/bias"] = sd[f"{b}{ours}.bias"]
        for ours, theirs in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            out[f"{p}MlpBlock_3/{theirs}/kernel"] = sd[f"{b}mlp.{ours}.weight"].T
            out[f"{p}MlpBlock_3/{theirs}/bias"] = sd[f"{b}mlp.{ours}.bias"]
    np.savez(path, **{prefix + k: v for k, v in out.items()})


def timm_fx_model(model: torch.nn.Module) -> torch.nn.Module:
    """timm's `_create_fx_model` (tests/test_models.py) in eval mode: its feature extractor
    returning the last node, traced with timm's leaf modules and functions."""
    from timm.models._features_fx import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    tracer_kwargs = dict(
        leaf_modules=get_notrace_modules(),
        autowrap_functions=get_notrace_functions(),
        param_shapes_constant=True,
    )
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(
        model,
        train_return_nodes=[train_nodes[-1]],
        eval_return_nodes=[eval_nodes[-1]],
        tracer_kwargs=tracer_kwargs,
    )


# The command line, SIGKILLing itself as it is about to rename the Nth write of state.pt over
# the last (KILL_AT=N): that write complete, not yet in place. `prelude` runs first (e.g. it
# registers a source of the test's own).
KILLED_AT_NTH_STATE = """
import os, signal, sys
from pathlib import Path

{prelude}
nth, writes, rename = int(os.environ.get("KILL_AT", "0")), 0, os.replace

def replace(src, dst, *args, **kwargs):
    global writes
    if Path(dst).name == "state.pt":
        writes += 1
        if writes == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    return rename(src, dst, *args, **kwargs)

os.replace = replace
from vitkit.cli import main

sys.exit(main(sys.argv[1:]))
"""


def killing_driver(path: Path, prelude: str = "") -> Path:
    """Write the `KILLED_AT_NTH_STATE` driver to `path` (run it with `run_driver`)."""
    path.write_text(KILLED_AT_NTH_STATE.format(prelude=prelude))
    return path


def run_driver(driver: Path, *argv: str, kill_at: int = 0) -> subprocess.CompletedProcess:
    """`python DRIVER ARGV` on the worktree's sources, killed at the `kill_at`th state write
    (0: never)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KILL_AT": str(kill_at)}
    return subprocess.run([sys.executable, str(driver), *argv], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def colour_list(folder: Path, n: int = 48, seed: int = 0) -> Path:
    """A multi-label file list: `n` tiny 8x8 PNGs in folder/img/, each lit in one or more of
    red / green / blue, and folder/train.csv naming those (`red;blue`)."""
    from PIL import Image

    colours = ("red", "green", "blue")
    (folder / "img").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows = ["path,label"]
    for i in range(n):
        on = [k for k in range(3) if rng.random() < 0.5] or [i % 3]
        pixels = rng.integers(0, 40, (8, 8, 3)) + 20
        pixels[..., on] += 160
        Image.fromarray(pixels.astype(np.uint8)).save(folder / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,{';'.join(colours[k] for k in on)}")
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    return folder / "train.csv"


def image_folder(root: Path, classes=("a", "b"), per_class: int = 6, size: int = 8) -> Path:
    """An ImageFolder of random RGB PNGs (`size` x `size`, seeded), root/<class>/<i>.png."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            array = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(array).save(root / name / f"{i}.png")
    return root
