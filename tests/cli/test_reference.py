"""docs/reference/cli.md is the page generated from the parsers: a flag added, renamed or
re-described without regenerating it fails here."""

from __future__ import annotations

from pathlib import Path

from vitkit import cli
from vitkit.cli import reference
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


def test_the_contributing_map_is_the_generated_one():
    """docs/contributing.md's architecture map is generated from the docstrings: a module
    added, moved or re-described without regenerating it fails here."""
    page = (PAGE.parents[1] / "contributing.md").read_text()
    committed = page.split(reference.MAP_BEGIN + "\n", 1)[1].split(reference.MAP_END, 1)[0]
    assert committed == reference.architecture_map(), (
        "docs/contributing.md's map is out of date: python -m vitkit.cli.reference --map"
    )


def test_the_map_names_every_module_with_its_first_sentence(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The package. More."""\n')
    (package / "a.py").write_text('"""Module a, as Smith et al. write it. Not this."""\n')
    (package / "sub" / "__init__.py").write_text('"""A sub-package: two modules."""\n')
    (package / "sub" / "b.py").write_text('"""B (e.g. a reader) does one thing."""\n')
    (package / "notes.txt").write_text("not a module")
    assert reference.architecture_map(package).splitlines() == [
        "```text",
        "src/pkg/",
        "  __init__.py  The package.",
        "  a.py         Module a, as Smith et al. write it.",
        "  sub/         A sub-package: two modules.",
        "    b.py  B (e.g. a reader) does one thing.",
        "```",
    ]


def test_the_walkthrough_names_what_the_code_has():
    """The four routine changes in contributing.md name these seams; each must exist."""
    import vitkit.data
    import vitkit.model
    import vitkit.model.vit.onednn
    import vitkit.train
    import vitkit.train.tasks.base
    import vitkit.weights.families

    page = (PAGE.parents[1] / "contributing.md").read_text()
    walkthrough = page.split("### The four routine changes", 1)[1]
    seams = {
        "`Architecture`": vitkit.model.Architecture,
        "`WeightsFamily`": vitkit.weights.families.WeightsFamily,
        "`FUSED_LAYERS`": vitkit.model.vit.onednn.FUSED_LAYERS,
        "`data.register_source(": vitkit.data.register_source,
        "`StreamSource`": vitkit.data.StreamSource,
        "`Task`": vitkit.train.tasks.base.Task,
        "`run_job(": vitkit.train.run_job,
    }
    for written, seam in seams.items():
        assert written in walkthrough and seam is not None, written
    assert callable(vitkit.train.tasks.base.Task.setup)
