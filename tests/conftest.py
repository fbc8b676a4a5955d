"""The suite's root: its directory is on sys.path (pytest's rootdir conftest), so any test
imports the shared helpers with `from _helpers import ...`.

What the whole suite shares:
- `@pytest.mark.requires("pkg", ..., extra="interop")` (`_helpers.requires_timm` and the
  like): the test is skipped where a package is missing, with the reason
  "missing package pkg: pip install -e '.[interop]'".
- `VITKIT_CI=1` (set by .ci/run): a test skipped for a missing package (a `requires` marker
  or `pytest.importorskip`), or a whole file skipped at collection, turns a session that
  passed into a failed one (exit status 1), and those tests are listed at the end. Per-test
  skips for the hardware (no native bf16, no oneDNN), for root rights or for the
  Fashion-MNIST files (which .ci/run installs) do not count.
- `--without PKG[,PKG...]`: run as if those packages were not installed (`sys.modules[PKG] =
  None`), to check that only the tests that need them are skipped.
- No time-based progress lines (`VITKIT_PROGRESS_EVERY_S=inf`, inherited by the commands the
  tests start): when one came would depend on the machine's load, and a terminal shows a bar
  that is erased instead; the tests of progress set the interval themselves.
- The `datasets` library's cache (`HF_DATASETS_CACHE`) in a temporary folder of the run, not
  the user's `~/.cache/huggingface`: the Hugging Face source tests build datasets into it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from types import TracebackType

import pytest

pytest_plugins = ["pytester"]  # tests/test_conftest.py runs these hooks in a pytest of its own

CI_VARIABLE = "VITKIT_CI"
MISSING_PACKAGE = "missing package"  # the reason of a `requires` skip starts with it
_MISSING_KEY = "missing_package"
_missing: list[str] = []  # "nodeid: reason" of each skip CI does not allow, in the order met
os.environ.setdefault("VITKIT_PROGRESS_EVERY_S", "inf")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="vitkit-tests-datasets-"))


def _ci() -> bool:
    return os.environ.get(CI_VARIABLE, "") not in ("", "0")


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without",
        default="",
        metavar="PKG[,PKG...]",
        help="run as if these packages were not installed (their tests must skip, by marker)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*packages, extra): skip where a package is missing, naming it and the extra",
    )
    for package in filter(None, config.getoption("without").split(",")):
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]
        sys.modules[package] = None  # `import package` raises ModuleNotFoundError


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in item.iter_markers("requires"):
            missing = [p for p in mark.args if not _installed(p)]
            if missing:
                extra = mark.kwargs["extra"]
                reason = f"{MISSING_PACKAGE} {', '.join(missing)}: pip install -e '.[{extra}]'"
                item.add_marker(pytest.mark.skip(reason=reason))


def _raised_by_importorskip(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code is pytest.importorskip.__code__:
            return True
        tb = tb.tb_next
    return False


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.skipped:
        reason = _skip_reason(report)
        from_importorskip = call.excinfo is not None and _raised_by_importorskip(call.excinfo.tb)
        if reason.startswith(MISSING_PACKAGE) or from_importorskip:
            report.user_properties.append((_MISSING_KEY, reason))  # travels with xdist
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, reason in report.user_properties:
        if key == _MISSING_KEY:
            _missing.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole file (or class) skipped: every test in it is hidden
        _missing.append(f"{report.nodeid} (the whole file): {_skip_reason(report)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    worker = hasattr(session.config, "workerinput")  # pytest-xdist: the controller decides
    passed = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if _ci() and _missing and passed and not worker:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    if not (_ci() and _missing):
        return
    terminalreporter.section(f"skipped, which {CI_VARIABLE}=1 does not allow", red=True)
    for line in _missing:
        terminalreporter.line(line)
    terminalreporter.line(
        f"{len(_missing)} skipped for a missing package or as a whole file: install the "
        "package (.ci/run installs the test extra), or mark the tests that need it"
    )
