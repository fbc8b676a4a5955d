"""How an error ends a command: one line `vitkit: error: ...` and an exit code (`ExitCode`)."""

from __future__ import annotations

from collections.abc import Mapping

from ..files import DiskFullError
from ..weights.checkpoint import OPTION_FORMS, ArchMismatchError, MissingOptionError
from .status import ExitCode


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit code 2."""


# Optional packages vitkit imports -> the extra that installs them (pyproject.toml); a package
# missing from this table is named by the extra of the command that ran (`Command.extra`).
EXTRAS = {
    "onnx": "onnx",
    "onnxscript": "onnx",
    "onnx_ir": "onnx",
    "onnxruntime": "onnx",
    "starlette": "serve",
    "uvicorn": "serve",
    "multipart": "serve",
    "python_multipart": "serve",
    "anyio": "serve",
    "prometheus_client": "serve",
    "pycocotools": "detection",
    "datasets": "datasets",
    "pyarrow": "datasets",
    "tensorboard": "tensorboard",
    "timm": "interop",
    "transformers": "interop",
    "torchvision": "interop",
}


def one_line(text: str) -> str:
    return " ".join(text.split())


# What `pip install vitkit` brings: a missing one of these is a broken install, not an extra.
CORE_MODULES = ("torch", "numpy", "safetensors", "sklearn", "PIL", "matplotlib", "tqdm", "vitkit")


def describe(
    err: BaseException, flags: Mapping[str, str] | None = None, extra: str | None = None
) -> tuple[ExitCode, str]:
    """(exit code, message) of an error: USAGE for a mistake in the command or its inputs,
    FAILED for a run that failed. `flags` are the command's flags for the library's options
    (e.g. {'num_heads': '--num-heads N'}): a hint names them instead of Python arguments;
    `extra` is the command's extra, the fix for an optional package it lacks."""
    if isinstance(err, (MissingOptionError, ArchMismatchError)):
        return ExitCode.USAGE, one_line(_option_hint(err, flags or {}))
    if isinstance(err, ImportError):
        name = (err.name or "").split(".")[0]
        needed = EXTRAS.get(name) or (extra if name and name not in CORE_MODULES else None)
        if needed:
            return ExitCode.USAGE, (
                f"this needs the optional package {name}, which is not installed: "
                f"pip install 'vitkit[{needed}]'"
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


def _option_hint(err: MissingOptionError | ArchMismatchError, flags: Mapping[str, str]) -> str:
    """The library's hint in the command's flags; what no flag gives is left to Python."""
    if isinstance(err, ArchMismatchError):
        flag = flags.get("arch", "arch=").split()[0]
        return (
            f"{flag} {err.arch} does not match the weights: they have {err.differences}; give "
            f"their architecture, or drop {flag}"
        )
    hint = err.hint(flags)
    if hint is not None:
        return f"{err.what}; pass {hint}"
    return (
        f"{err.what}; the command line cannot give it: load the weights in Python with "
        f"vitkit.load_pretrained(..., {err.hint(OPTION_FORMS)}) and vitkit.save them"
    )
