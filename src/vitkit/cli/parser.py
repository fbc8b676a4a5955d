"""argparse as `vitkit` wants it: a mistake is one line (`UserError`) that names the command's
own help and, for a misspelt flag, command or choice, the closest name; no flag is taken
from a prefix of another (`--epoch` is not `--epochs`)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import UserError

_INVALID_CHOICE = re.compile(r"^(\S+) invalid choice: '([^']*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one `UserError` line naming the command's help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # passed on to every sub-parser
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse, but an unknown flag is reported first (before a missing required one
        it may be a misspelling of) and by the command it was given to."""
        args = list(sys.argv[1:] if args is None else args)
        name = next((a for a in args if not a.startswith("-")), None)
        command = self._sub_parser(name)
        known = command.flags() | self.flags()
        for word in args if command is not self or name is None else ():
            if word == "--":
                break
            if word.startswith("--") and word.split("=", 1)[0] not in known:
                command.unrecognized([word])
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command.unrecognized(extras)
        return parsed

    def flags(self) -> set[str]:
        """Every option string of this parser."""
        return {s for action in self._actions for s in action.option_strings}

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        flag = next((word for word in extras if word.startswith("-")), None)
        if flag is None:
            self.error(f"unexpected argument {' '.join(extras)}")
        name = flag.split("=", 1)[0]
        self.error(f"unknown flag {name}{_did_you_mean(name, sorted(self.flags()))}")

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
        choice = _INVALID_CHOICE.match(message)
        if choice is not None:
            what, given, listed = choice.groups()
            names = [name.strip("'") for name in listed.split(", ")]
            if what == "COMMAND":
                message = f"unknown command {given!r}{_did_you_mean(given, names)}"
            else:
                hint = _did_you_mean(given, names, then=f"; choose from {', '.join(names)}")
                message = f"{what}: unknown choice {given!r}{hint}"
        raise UserError(f"{message}; see `{self.prog} --help`")

    def _sub_parser(self, name: str | None) -> Parser:
        """The sub-parser of command `name`, else this parser."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                found = action.choices.get(name or "")
                if isinstance(found, Parser):
                    return found
        return self


def debug_flag(parser: argparse.ArgumentParser, *, default: Any = False) -> None:
    """`--debug`, taken before the command (`default` False) and after it (`default`
    SUPPRESS, so that it does not undo one given before)."""
    parser.add_argument(
        "--debug", action="store_true", default=default, help="show full tracebacks on errors"
    )


def _did_you_mean(given: str, names: Sequence[str], then: str = "") -> str:
    """' (did you mean NAME?)' for the name closest to `given`, if one is close."""
    bare = {name.lstrip("-"): name for name in names}  # '--' alone makes flags look alike
    close = [bare[n] for n in difflib.get_close_matches(given.lstrip("-"), list(bare), n=1)]
    inner = [f"did you mean {close[0]}?"] if close else []
    inner += [then.removeprefix("; ")] if then else []
    return f" ({'; '.join(inner)})" if inner else ""
