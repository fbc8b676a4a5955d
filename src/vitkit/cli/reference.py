"""The command-line reference page (docs/reference/cli.md), generated from the parsers so that
it cannot drift from them: every command, every flag, its help (which states its default).
`python -m vitkit.cli.reference > docs/reference/cli.md` rewrites the page; a test fails when
the committed page differs."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from . import COMMANDS, build_parser

_HEADER = """\
# Command line

Generated from vitkit's argument parsers (`python -m vitkit.cli.reference`): every command and
every flag, with the help `vitkit COMMAND --help` prints. A flag's default is stated in its
help; options left unset take the recipe's or the weights' value, as the help says. Errors and
exit codes: [Errors and exit codes](errors.md).

"""


def cli_reference() -> str:
    """The page: `vitkit`'s own flags, then one section per command, one table per group."""
    parser = build_parser()
    commands = _sub_parsers(parser)
    lines = [_HEADER.rstrip("\n"), "", "## vitkit", "", "```text", _usage(parser), "```", ""]
    lines += [f"| `{name}` | {_cell(COMMANDS[name].summary)} |" for name in commands]
    lines[-len(commands) : -len(commands)] = ["| Command | What it does |", "| --- | --- |"]
    lines += ["", *_groups(parser)]
    for name, sub in commands.items():
        lines += [f"## vitkit {name}", "", _cell(sub.description or COMMANDS[name].summary), ""]
        lines += ["```text", _usage(sub), "```", "", *_groups(sub)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _usage(parser: argparse.ArgumentParser) -> str:
    """A short usage line: the command, its positional arguments, then [options]."""
    positionals = [
        _invocation(action, positional=True)
        for action in parser._actions
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
    ]
    command = "COMMAND ..." if parser.prog == "vitkit" else ""
    return " ".join(filter(None, [parser.prog, "[options]", *positionals, command]))


def _groups(parser: argparse.ArgumentParser) -> Iterator[str]:
    """One table per argument group, in the parser's order; `--help` left out."""
    for group in parser._action_groups:
        actions = [
            action
            for action in group._group_actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if not actions:
            continue
        yield f"**{group.title[0].upper()}{group.title[1:]}**"
        yield ""
        yield "| Argument | What it does |"
        yield "| --- | --- |"
        for action in actions:
            name = _invocation(action, positional=not action.option_strings)
            yield f"| `{name}` | {_cell(action.help or '')} |"
        yield ""


def _invocation(action: argparse.Action, positional: bool) -> str:
    """How the argument is written: `--lr LR`, `--strict, --no-strict`, `IMAGE [IMAGE ...]`."""
    if action.choices is not None and action.metavar is None:
        metavar: str | tuple[str, ...] = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.metavar or (action.dest if positional else action.dest.upper())
    names = [metavar] if isinstance(metavar, str) else list(metavar)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.nargs == "+":
        value = f"{names[0]} [{names[0]} ...]"
    elif action.nargs == "*":
        value = f"[{names[0]} ...]"
    elif action.nargs == "?":
        value = f"[{names[0]}]"
    elif isinstance(action.nargs, int):
        value = " ".join(names if len(names) == action.nargs else names * action.nargs)
    else:
        value = names[0]
    if positional:
        return value
    return ", ".join(f"{flag} {value}" for flag in action.option_strings)


def _cell(text: str) -> str:
    """Text for one markdown table cell (or a paragraph): one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(cli_reference(), end="")
