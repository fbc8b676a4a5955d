"""How an error ends a command: one line `vitkit: error: ...` and an exit code (`ExitCode`)."""

from __future__ import annotations

from ..files import DiskFullError
from .status import ExitCode


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit code 2."""


# Optional packages -> the extra that installs them (pyproject.toml).
EXTRAS = {
    "onnx": "onnx",
    "onnxscript": "onnx",
    "onnx_ir": "onnx",
    "onnxruntime": "onnx",
    "timm": "interop",
    "transformers": "interop",
    "torchvision": "interop",
}


def one_line(text: str) -> str:
    return " ".join(text.split())


def describe(err: BaseException) -> tuple[ExitCode, str]:
    """(exit code, message) of an error: USAGE for a mistake in the command or its inputs,
    FAILED for a run that failed."""
    if isinstance(err, ImportError):
        name = (err.name or "").split(".")[0]
        if name in EXTRAS:
            return ExitCode.USAGE, (
                f"this needs the optional package {name}, which is not installed: "
                f"pip install 'vitkit[{EXTRAS[name]}]'"
            )
        return ExitCode.FAILED, f"{one_line(str(err))}; reinstall vitkit (pip install -e .)"
    if isinstance(err, (FloatingPointError, DiskFullError)):  # names the files kept
        return ExitCode.FAILED, one_line(str(err))
    if isinstance(err, PermissionError):
        return ExitCode.FAILED, (
            f"permission denied: {err.filename}; check the permissions of that path or "
            "choose another location"
        )
    if isinstance(err, (UserError, ValueError, TypeError, OSError)):
        return ExitCode.USAGE, one_line(str(err))
    if isinstance(err, MemoryError):
        return ExitCode.FAILED, "out of memory; use a smaller --batch-size or model"
    first = one_line(str(err).strip().splitlines()[0]) if str(err).strip() else ""
    return ExitCode.FAILED, (
        f"unexpected {type(err).__name__}: {first[:300]}; rerun with --debug for the "
        "traceback and report it"
    )
