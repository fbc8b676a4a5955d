"""docs/reference/cli.md is the page generated from the parsers: a flag added, renamed or
re-described without regenerating it fails here."""

from __future__ import annotations

from pathlib import Path

from vitkit import cli
from vitkit.cli.reference import cli_reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"


def test_the_committed_cli_reference_is_the_generated_one():
    assert PAGE.read_text() == cli_reference(), (
        "docs/reference/cli.md is out of date: python -m vitkit.cli.reference > "
        "docs/reference/cli.md"
    )


def test_the_reference_has_a_section_and_a_row_for_every_command_and_flag():
    page = cli_reference()
    parser = cli.build_parser()
    for name in cli.COMMANDS:
        assert f"\n## vitkit {name}\n" in page
        assert f"| `{name}` | " in page
    train = page.split("\n## vitkit train\n")[1].split("\n## ")[0]
    assert "| `--lr X` | " in train
    assert "| `--strict, --no-strict` | " in train
    assert "| `--recipe {deit,small,fashion-mnist,mnist,mnist-5k,finetune}` | " in train
    predict = page.split("\n## vitkit predict\n")[1].split("\n## ")[0]
    assert "vitkit predict [options] IMAGE [IMAGE ...]" in predict
    for name, sub in _commands(parser).items():
        section = page.split(f"\n## vitkit {name}\n")[1].split("\n## ")[0]
        missing = [
            flag
            for action in sub._actions
            for flag in action.option_strings
            if flag not in ("-h", "--help")
            and f"`{flag}" not in section
            and f", {flag}" not in section
        ]
        assert missing == [], name


def _commands(parser):
    return next(a.choices for a in parser._actions if isinstance(a.choices, dict))
