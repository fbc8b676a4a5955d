"""`vitkit` as a whole (`cli/__init__.py`, `cli/parser.py`): the manners of a command line.
No flag is a prefix of another; a misspelt flag, command or choice gets the closest name and
the command's own help; `--debug` goes before or after the command; a reader that closes the
pipe ends it quietly; `--help` and `models` import no command module they do not run."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vitkit
from vitkit import cli
from vitkit.cli import ExitCode
from vitkit.cli import train as train_command

SRC = Path(vitkit.__file__).resolve().parents[1]


def _python(code: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True, **kwargs)


def test_exit_codes_are_named():
    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 130]
    assert ExitCode.USAGE.name == "USAGE"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--epoch", "3"], "unknown flag --epoch (did you mean --epochs?); "
         "see `vitkit train --help`"),
        (["train", "--pretrain", "w.pth"], "unknown flag --pretrain (did you mean "
         "--pretrained?); see `vitkit train --help`"),
        (["predict", "--chekpoint", "m.safetensors", "x.png"], "unknown flag --chekpoint (did "
         "you mean --checkpoint?); see `vitkit predict --help`"),
        (["eval", "--checkpoint", "m.safetensors", "--split=tset"], "--split: unknown choice "
         "'tset' (did you mean test?; choose from test, val, train, all); see `vitkit eval "
         "--help`"),
        (["tarin", "--epochs", "3"], "unknown command 'tarin' (did you mean train?); see "
         "`vitkit --help`"),
        (["models", "--zzz"], "unknown flag --zzz; see `vitkit models --help`"),
        (["models", "a*", "b*"], "unexpected argument b*; see `vitkit models --help`"),
    ],
)  # fmt: skip
def test_mistakes_name_the_closest_name_and_the_commands_help(run_cli, argv, message):
    assert run_cli(*argv) == (2, "", f"vitkit: error: {message}\n")


def test_no_parser_takes_a_prefix_of_a_flag():
    parser = cli.build_parser()
    parsers = [parser] + [
        sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for sub in action.choices.values()
    ]
    assert len(parsers) == 1 + len(cli.COMMANDS)
    assert all(p.allow_abbrev is False for p in parsers)


def test_debug_goes_before_or_after_the_command(tmp_path, run_cli, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("deep inside")

    monkeypatch.setattr(train_command, "resolve_config", broken)
    for argv in (["--debug", "train"], ["train", "--debug"]):
        with pytest.raises(RuntimeError, match="deep inside"):
            cli.main([*argv, "--out", str(tmp_path / "run")])
    code, out, err = run_cli("models", "vit_tiny_patch16_2*", "--debug")
    assert (code, out, err) == (0, "vit_tiny_patch16_224\n", "")


def test_a_closed_pipe_ends_quietly():
    """`vitkit models | head -1`: the reader goes away before the listing is written."""
    child = _python(
        "import time, sys; from vitkit.cli import main; time.sleep(0.5); "
        "sys.exit(main(['models']))",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # as `head` exits
    err = child.stderr.read()
    assert (child.wait(timeout=120), err) == (0, "")


def test_help_and_models_import_no_command_they_do_not_run():
    code = (
        "import sys, contextlib, io\n"
        "from vitkit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    main(['models'])\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('vitkit', 'matplotlib')))))"
    )
    child = _python(code, stdout=subprocess.PIPE)
    loaded = set(child.communicate(timeout=120)[0].split())
    assert child.returncode == 0 and "vitkit.cli.models" in loaded
    heavy = {"vitkit.train", "vitkit.explain", "matplotlib", "vitkit.cli.train",
             "vitkit.cli.eval", "vitkit.cli.options"}  # fmt: skip
    assert loaded & heavy == set()


@pytest.mark.parametrize("argv", [[], ["--debug"]])
def test_vitkit_alone_lists_the_commands(run_cli, argv):
    code, out, err = run_cli(*argv)
    assert (code, err) == (0, "")
    assert out.startswith("usage: vitkit [-h] [--debug] COMMAND ...\n")
    commands = out.split("COMMAND\n", 1)[1].split("\n\n", 1)[0].splitlines()
    listed = [line.split()[0] for line in commands if not line.startswith(" " * 6)]
    assert listed == list(cli.COMMANDS)
