"""The `vitkit` command line: one module per command (`commands.COMMANDS`), each with
`register(subparsers)`, which declares its flags, and `run(args)`, which calls the library.
Flags shared by several commands are declared once (`options`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from .commands import COMMANDS, add_command, command_module
from .errors import UserError, describe
from .parser import Parser, debug_flag
from .status import ExitCode

__all__ = ["COMMANDS", "ExitCode", "UserError", "build_parser", "main"]


def build_parser(only: Collection[str] | None = None) -> Parser:
    """The `vitkit` parser with every command's flags, or only those of the commands in `only`
    (the others are listed by name and summary, their modules not imported)."""
    parser = Parser(
        prog="vitkit", description="Vision Transformers: train, evaluate, predict, explain."
    )
    debug_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is None or name in only:
            command_module(name).register(sub)
        else:
            add_command(sub, name)
    return parser


def _command_in(arguments: Sequence[str]) -> str | None:
    """The command a command line names (its first word that is not a flag), if any."""
    return next((a for a in arguments if not a.startswith("-")), None)


def _option_flags(args: Any) -> dict[str, str]:
    """How the command line that was parsed gives the library's options, so that an error's
    hint names its flags (none before it was parsed)."""
    if args is None:
        return {}
    from .options import option_flags  # the flag machinery, only when an error needs it

    return option_flags(args)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does (exit 130 with a message), in every phase;
    training installs its own handler, which saves the state first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (`ExitCode`: 0 ok, 1 the run failed, 2 a
    mistake in the command or its inputs, 130 interrupted). Every error is one line
    `vitkit: error: ...`; `--debug` (before or after the command) shows the traceback
    instead. Output cut short by its reader (`vitkit models | head -1`) ends quietly; `vitkit`
    alone lists the commands."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in arguments
    if _command_in(arguments) is None and not {"-h", "--help"} & set(arguments):
        print(build_parser(only=()).format_help(), end="")  # `vitkit` alone: the commands
        return ExitCode.OK
    with _sigterm_interrupts():
        args = None
        try:
            args = build_parser(only=[_command_in(arguments)]).parse_args(arguments)
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            code = command_module(args.command).run(args)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return int(code)
        except BrokenPipeError:
            _discard_stdout()
            return ExitCode.OK
        except KeyboardInterrupt as err:
            how = f" ({err.args[0]})" if err.args else ""
            print(f"vitkit: interrupted{how}", file=sys.stderr)
            return ExitCode.INTERRUPTED
        except Exception as err:
            if debug:
                raise
            command = _command_in(arguments)
            extra = COMMANDS[command].extra if command in COMMANDS else None
            code, message = describe(err, _option_flags(args), extra)
            print(f"vitkit: error: {message}", file=sys.stderr)
            return int(code)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again on
    the closed pipe (Python's documented handling of SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (captured in tests)
        pass
