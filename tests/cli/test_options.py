"""Every flag of every command says what it does, and each shared flag is declared once (one
help text wherever it appears)."""

from __future__ import annotations

import argparse

import pytest

from vitkit import cli


def _sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            yield action


def test_every_flag_of_every_command_has_help():
    parser = cli.build_parser()
    commands = _sub_parsers(parser)
    assert set(commands) == set(cli.COMMANDS)
    bare = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, sub in [("vitkit", parser), *commands.items()]
        for action in _actions(sub)
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert bare == []


def test_a_shared_flag_has_one_help_text():
    """`cli/options.py` declares each shared flag once (train's and pretrain's flags are
    generated from `TrainConfig` instead)."""
    helps: dict[str, set[str]] = {}
    for name, sub in _sub_parsers(cli.build_parser()).items():
        if name in ("train", "pretrain"):
            continue
        for action in _actions(sub):
            for flag in action.option_strings:
                helps.setdefault(flag, set()).add(action.help)
    for flag in ("--checkpoint", "--device", "--batch-size", "--precision"):
        assert len(helps[flag]) >= 1
    assert len(helps["--checkpoint"]) == len(helps["--device"]) == 1
    assert {text.split(" (default")[0] for text in helps["--batch-size"]} == {
        "images per forward pass"
    }
    assert {text.split(" instead")[0].split()[0] for text in helps["--json"]} == {"print"}


@pytest.mark.parametrize("command", ["predict", "eval", "explain", "export"])
def test_the_weights_commands_declare_checkpoint_and_device_with_help(command):
    sub = _sub_parsers(cli.build_parser())[command]
    text = sub.format_help()
    assert "--checkpoint PATH" in text
    flags = {flag: action for action in _actions(sub) for flag in action.option_strings}
    assert flags["--checkpoint"].help
    if command != "export":
        assert flags["--device"].help.startswith("where the model runs")


# -- how a hint names an option: derived from the command's own flags --------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train"], {"num_heads": "--model-opt num_heads=N", "arch": "--model NAME",
                     "act_layer": "--model-opt act_layer=NAME",
                     "norm_eps": "--model-opt norm_eps=X",
                     "no_embed_class": "--model-opt no_embed_class=true / false",
                     "img_size": "--img-size N", "in_chans": "--in-chans N"}),
        (["pretrain"], {"num_heads": "--model-opt num_heads=N", "arch": "--model NAME"}),
        (["convert", "--from", "timm", "a", "b"],
         {"num_heads": "--num-heads N", "arch": "--arch NAME", "hf_config": "--hf-config JSON"}),
        (["eval", "--checkpoint", "w"], {"num_heads": "--num-heads N", "arch": "--arch NAME"}),
        (["summary", "vit_digits"], {"num_heads": "--num-heads N", "arch": "--arch NAME",
                                     "norm_eps": "--model-opt norm_eps=X"}),
    ],
)  # fmt: skip
def test_hints_name_the_flags_the_command_line_has(argv, expected):
    from vitkit.cli.options import option_flags

    forms = option_flags(cli.build_parser().parse_args(argv))
    assert {name: forms.get(name) for name in expected} == expected
    if argv[0] in ("convert", "eval"):
        assert "act_layer" not in forms  # no flag gives it: the hint leaves it to Python


def test_python_hints_are_derived_from_the_schemas():
    from vitkit.weights.checkpoint import OPTION_FORMS

    assert {name: OPTION_FORMS[name] for name in (
        "num_heads", "arch", "hf_config", "img_size", "no_embed_class", "act_layer", "norm_eps",
    )} == {
        "num_heads": "num_heads=N", "arch": "arch='<timm model name>'",
        "hf_config": "hf_config=PATH", "img_size": "img_size=(h, w)",
        "no_embed_class": "no_embed_class=True / False", "act_layer": "act_layer=NAME",
        "norm_eps": "norm_eps=X",
    }  # fmt: skip
