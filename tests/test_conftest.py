"""The suite's own hooks (tests/conftest.py), run in a pytest of their own: under VITKIT_CI=1 a
skip for a missing package, or a file skipped as a whole, fails the session and is listed;
hardware skips do not; `--without PKG` skips exactly the tests marked as needing PKG."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
TESTS = """
import pytest


@pytest.mark.requires("tqdm", "no_such_package_at_all", extra="test")
def test_marked():
    pass


def test_importorskip():
    pytest.importorskip("no_such_package_here", reason="a reason of its own")


@pytest.mark.skipif(True, reason="this CPU has native bf16")
def test_hardware():
    pass


def test_root():
    pytest.skip("making a device node needs root")


@pytest.mark.requires("tqdm", extra="test")
def test_tqdm():
    import tqdm

    assert tqdm.__name__ == "tqdm"


def test_plain():
    pass
"""
FILE_WIDE = """
import pytest

pytest.importorskip("no_such_package_either")


def test_hidden():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A folder with the suite's conftest and the tests above (pytest in a subprocess: the
    hooks' record of skips is per process)."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_some=TESTS)
    return pytester


def test_without_ci_the_skips_are_only_reported(suite, monkeypatch):
    monkeypatch.delenv("VITKIT_CI", raising=False)
    result = suite.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=2, skipped=4)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["SKIPPED * test_some.py:*: missing package no_such_package_at_all: pip install *"]
    )
    assert "VITKIT_CI=1 does not allow" not in result.stdout.str()


def test_ci_fails_on_missing_packages_only(suite, monkeypatch):
    monkeypatch.setenv("VITKIT_CI", "1")
    result = suite.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=2, skipped=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    section = result.stdout.str().split("VITKIT_CI=1 does not allow")[1]
    listed = [line for line in section.splitlines() if line.startswith("test_some.py::")]
    assert listed == [
        "test_some.py::test_marked: missing package no_such_package_at_all: pip install -e "
        "'.[test]'",
        "test_some.py::test_importorskip: a reason of its own",
    ]
    assert "2 skipped for a missing package or as a whole file" in section


def test_ci_fails_on_a_file_skipped_as_a_whole(suite, monkeypatch):
    suite.makepyfile(test_whole=FILE_WIDE)
    monkeypatch.setenv("VITKIT_CI", "1")
    result = suite.runpytest_subprocess("test_whole.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["test_whole.py (the whole file): could not import 'no_such_package_either'*"]
    )
    monkeypatch.setenv("VITKIT_CI", "0")
    assert suite.runpytest_subprocess("test_whole.py").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_a_failed_session_stays_failed_and_a_clean_one_passes(suite, monkeypatch):
    monkeypatch.setenv("VITKIT_CI", "1")
    suite.makepyfile(test_other="def test_fails():\n    assert False\n")
    assert suite.runpytest_subprocess("test_other.py").ret == pytest.ExitCode.TESTS_FAILED
    clean = suite.runpytest_subprocess("test_some.py::test_plain", "test_some.py::test_hardware")
    clean.assert_outcomes(passed=1, skipped=1)
    assert clean.ret == pytest.ExitCode.OK


def test_without_a_package_only_its_marked_tests_skip(suite, monkeypatch):
    monkeypatch.setenv("VITKIT_CI", "1")
    result = suite.runpytest_subprocess("--without", "tqdm", "-k", "tqdm or plain")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["test_some.py::test_tqdm: missing package tqdm: *"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    suite.runpytest_subprocess("-k", "tqdm or plain").assert_outcomes(passed=2)
