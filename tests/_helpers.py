"""Helpers shared by the test suite: randomised weights for equivalence tests, and skips that
name the package a test needs (per test, never a whole file)."""

from __future__ import annotations

import importlib.util

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


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # e.g. blocked with sys.modules[package] = None
        return False


def _requires(package: str, extra: str) -> pytest.MarkDecorator:
    missing = not _installed(package)
    reason = f"needs {package}, which is not installed (pip install -e '.[{extra}]')"
    return pytest.mark.skipif(missing, reason=reason)


requires_timm = _requires("timm", "interop")
requires_torchvision = _requires("torchvision", "interop")
requires_torchinfo = _requires("torchinfo", "test")


def _requires_onednn() -> pytest.MarkDecorator:
    from vitkit.model.onednn_support import unsupported_reason

    reason = unsupported_reason()
    return pytest.mark.skipif(bool(reason), reason=f"no oneDNN fast path here: {reason}")


# Where this torch build cannot run the oneDNN fast path: skipped, with the reason.
requires_onednn = _requires_onednn()
