"""The option schema (`vitkit.options`): a field declared once gives its type check, range,
choices, name suggestions, settings-file reading and command-line flag."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import Any

import pytest

from vitkit.options import (
    AT_LEAST_ONE,
    POSITIVE,
    PROBABILITY,
    REQUIRED,
    Options,
    Range,
    SettingsError,
    check_names,
    check_options,
    check_value,
    close_names,
    from_text,
    kind_of,
    option,
    option_names,
    read_settings,
)
from vitkit.options.flags import add_flags, given_options


@dataclass(frozen=True, kw_only=True)
class Inner(Options):
    NOUN = "inner option"
    GROUPS = {"shape": "inner shape", "other": "inner other"}

    size: int | tuple[int, int] = option(8, "N or H W", range=Range(1, 64), metavar="N",
                                         group="shape")  # fmt: skip
    layers: tuple[int, ...] = option((), "channels", range=AT_LEAST_ONE, group="shape")
    scale: float | None = option(None, "a scale", range=POSITIVE, group="other")
    kind: str = option("x", "a kind", choices=("x", "y"), group="other")
    bias: bool = option(True, "a bias", group="other")
    classes: int = option(3, "set by the data", group="other")


@dataclass(frozen=True, kw_only=True)
class Job(Options):
    NOUN = "setting"
    GROUPS = {"main": "main options", "run": "how it runs"}

    epochs: int = option(10, "passes", range=AT_LEAST_ONE, grows=True, group="main")
    rate: float = option(0.5, "a probability", range=PROBABILITY, group="main")
    crop: tuple[float, float] | None = option(
        (0.1, 1.0), "crop range", metavar=("MIN", "MAX"),
        none_flag=("no-crop", "no crops"), group="main",
    )  # fmt: skip
    inner: dict[str, Any] = option(
        {}, "an inner option by name", of=Inner, no_flags=("classes",), flag="inner-opt",
        group="main",
    )  # fmt: skip
    fast: bool = option(False, "go fast", runtime=True, group="run")
    extra: int = option(0, "added later", since=True, group="run")


# -- types --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hint, text",
    [
        (int, "an integer"),
        (float, "a number"),
        (bool, "true or false"),
        (str, "a string"),
        (float | None, "a number or null"),
        (tuple[int, int], "a list of 2 integers"),
        (tuple[float, ...], "a list of numbers"),
        (int | tuple[int, int], "an integer or a list of 2 integers"),
        (dict[str, Any], "an object"),
        (tuple[float, float] | None, "a list of 2 numbers or null"),
    ],
)
def test_annotations_decode_to_kinds(hint, text):
    assert kind_of(hint).describe() == text


def test_annotations_without_a_kind_are_refused():
    with pytest.raises(TypeError, match="an option's tuple holds one type"):
        kind_of(tuple[int, str])
    with pytest.raises(TypeError, match="an option cannot have the type"):
        kind_of(list[int])


@pytest.mark.parametrize(
    "name, value, error, message",
    [
        ("epochs", "3", TypeError, 'epochs must be an integer, got "3" (str)'),
        ("epochs", True, TypeError, "epochs must be an integer, got true (bool)"),
        ("epochs", 2.5, TypeError, "epochs must be an integer, got 2.5 (float)"),
        ("rate", None, TypeError, "rate must be a number, got null (null)"),
        ("fast", 1, TypeError, "fast must be true or false, got 1 (int)"),
        ("crop", [0.1], TypeError, "crop must be a list of 2 numbers or null, got [0.1] (list)"),
        ("inner", [1], TypeError, "inner must be an object, got [1] (list)"),
        ("epochs", 0, ValueError, "epochs must be >= 1, got 0"),
        ("rate", 1.5, ValueError, "rate is a probability in [0, 1], got 1.5"),
        ("rate", math.nan, ValueError, "rate must be a finite number in [0, 1], got nan"),
        ("crop", (0.5, math.inf), ValueError, "crop must be a finite number, got (0.5, inf)"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(name, value, error, message):
    with pytest.raises(error) as err:
        check_value(Job, name, value)
    assert str(err.value) == message


def test_unions_ranges_and_choices_of_each_kind():
    assert check_value(Inner, "size", 4) == 4
    assert check_value(Inner, "size", [4, 6]) == (4, 6)  # JSON lists become tuples
    with pytest.raises(ValueError, match=r"^size must be in \[1, 64\], got \(4, 65\)$"):
        check_value(Inner, "size", (4, 65))  # each side of a pair
    with pytest.raises(TypeError, match=r"^size must be an integer or a list of 2 integers"):
        check_value(Inner, "size", (4, 6, 8))
    assert check_value(Inner, "layers", []) == ()
    with pytest.raises(ValueError, match=r"^layers must be >= 1, got \(8, 0\)$"):
        check_value(Inner, "layers", [8, 0])
    assert check_value(Inner, "scale", None) is None and check_value(Inner, "scale", 2) == 2
    with pytest.raises(ValueError, match=r"^scale must be > 0, got -1$"):
        check_value(Inner, "scale", -1)
    assert check_value(Inner, "scale", 10**400) == 10**400  # an int too large for a float
    with pytest.raises(ValueError, match=r"^size must be in \[1, 64\], got 1000000000"):
        check_value(Inner, "size", 10**400)
    with pytest.raises(ValueError, match=r"^unknown kind 'z'; expected one of 'x', 'y'$"):
        check_value(Inner, "kind", "z")


def test_range_wording():
    assert Range(0, 1, high_open=True).describe() == "must be in [0, 1)"
    assert Range(0, 1, low_open=True).describe() == "must be in (0, 1]"
    assert Range(1e-5, note="(tiny)").describe() == "must be >= 1e-05 (tiny)"
    assert Range(0, 10_000_000).phrase() == "in [0, 10000000]"


def test_unknown_names_suggest_the_closest():
    with pytest.raises(TypeError) as err:
        check_names(Job, ["epoch", "rat", "colour"], "setting(s)", "; see --help")
    assert str(err.value) == (
        "unknown setting(s) 'epoch' (did you mean epochs?), 'rat' (did you mean rate?), "
        "'colour'; see --help"
    )
    check_names(Job, ["epochs"], "setting(s)")  # known: nothing raised
    with pytest.raises(TypeError, match=r"^unknown inner option 'sise' \(did you mean size\?\); "):
        check_options(Inner, {"sise": 3}, "inner option")
    assert check_options(Inner, {"size": [2, 3]}, "inner option") == {"size": (2, 3)}


# -- configs ----------------------------------------------------------------------------------


def test_a_config_checks_every_field_and_round_trips_through_json():
    job = Job(epochs=3, crop=[0.2, 0.9], inner={"size": (4, 6)})
    assert job.crop == (0.2, 0.9)
    data = json.loads(json.dumps(job.to_dict()))
    assert data["crop"] == [0.2, 0.9] and data["inner"] == {"size": [4, 6]}
    assert Job.from_dict(data).to_dict() == job.to_dict()
    with pytest.raises(TypeError, match=r"^epochs must be an integer"):
        Job(epochs="3")
    with pytest.raises(TypeError, match=r"^unknown setting 'epoch' \(did you mean epochs\?\)"):
        job.replace(epoch=4)
    with pytest.raises(TypeError, match="^a Job is built from a dict, got list$"):
        Job.from_dict([1])
    assert job.replace(epochs=5).epochs == 5
    assert option_names(Job, "runtime") == ("fast",) and option_names(Job, "grows") == ("epochs",)
    assert set(option_names(Job, "since")) == {"fast", "extra"}  # runtime options may be absent


def test_a_dict_default_is_not_shared():
    first, second = Job(), Job()
    assert first.inner == {} and first.inner is not second.inner


# -- settings files ---------------------------------------------------------------------------


def test_settings_files(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"epochs": 3, "crop": [0.5, 1]}')
    assert read_settings(path, Job) == {"epochs": 3, "crop": (0.5, 1)}
    record = Job(epochs=4).to_dict()
    path.write_text(json.dumps({"settings": record, "model": {}}))  # a run's config.json
    assert Job.from_dict(read_settings(path, Job, complete=True)) == Job(epochs=4)
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "extra"}))
    assert read_settings(path, Job, complete=True)["epochs"] == 4  # `since` may be missing
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "rate"}))
    with pytest.raises(SettingsError, match=r"^run\.json: missing setting\(s\) rate; add them"):
        read_settings(path, Job, source="run.json", complete=True)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"epochs": "3"}', 'epochs must be an integer, got "3" (str)'),
        ('{"epochs": 0}', "epochs must be >= 1, got 0"),
        ('{"inner": {"size": 0}}', None),  # entries of a dict option are the config's to check
        ('{"epoch": 3}', "unknown setting(s) 'epoch' (did you mean epochs?); the names are"),
        ('{"epochs": 3,}', "invalid JSON at line 1, column 14: Expecting property name"),
        ("[1]", "expected a JSON object of settings, got [1] (list)"),
        ("[" * 100_000, "nested too deeply to be a settings file"),
    ],
)
def test_a_wrong_settings_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "s.json"
    path.write_text(text)
    if message is None:
        assert read_settings(path, Job) == {"inner": {"size": 0}}
        return
    with pytest.raises(SettingsError) as err:
        read_settings(path, Job, source="--config s.json")
    assert str(err.value).startswith(f"--config s.json: {message}")
    assert "\n" not in str(err.value)


def test_settings_of_an_older_release_are_upgraded_first(tmp_path):
    @dataclass(frozen=True, kw_only=True)
    class Renamed(Options):
        passes: int = option(1, "passes", range=AT_LEAST_ONE)

        @classmethod
        def upgrade_settings(cls, values):
            return {"passes": values["epochs"]} if "epochs" in values else values

    path = tmp_path / "old.json"
    path.write_text('{"epochs": 7}')
    assert read_settings(path, Renamed) == {"passes": 7}


# -- command-line flags -----------------------------------------------------------------------


def _parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="job", exit_on_error=False)
    add_flags(parser, Job, **kwargs)
    return parser


def _given(argv: list[str]) -> dict[str, Any]:
    return given_options(_parser().parse_args(argv), Job)


def test_only_what_the_command_line_names_is_given():
    assert _given([]) == {}
    assert _given(["--epochs", "3", "--rate", "0.25"]) == {"epochs": 3, "rate": 0.25}


@pytest.mark.parametrize(
    "argv, given",
    [
        (["--crop", "0.2", "0.8"], {"crop": (0.2, 0.8)}),
        (["--no-crop"], {"crop": None}),
        (["--fast"], {"fast": True}),
        (["--no-fast"], {"fast": False}),
        (["--bias"], {"inner": {"bias": True}}),  # on by default: still both ways
        (["--no-bias"], {"inner": {"bias": False}}),
        (["--size", "5"], {"inner": {"size": 5}}),
        (["--size", "5", "7"], {"inner": {"size": (5, 7)}}),
        (["--layers"], {"inner": {"layers": ()}}),
        (["--layers", "8", "16"], {"inner": {"layers": (8, 16)}}),
        (["--kind", "y", "--scale", "2"], {"inner": {"kind": "y", "scale": 2.0}}),
        (["--inner-opt", "classes=5"], {"inner": {"classes": 5}}),
        (["--inner-opt", "kind=y", "--size", "4"], {"inner": {"kind": "y", "size": 4}}),
        (["--inner-opt", "scale=null"], {"inner": {"scale": None}}),
    ],
)
def test_every_kind_of_flag_round_trips(argv, given):
    values = _given(argv)
    assert values == given
    Job(**values)  # and the config takes them


def test_flag_mistakes_are_one_line():
    parser = _parser()
    with pytest.raises(argparse.ArgumentError, match=r"--epochs: must be an integer, got 'x'"):
        parser.parse_args(["--epochs", "x"])
    with pytest.raises(argparse.ArgumentError, match=r"--inner-opt: takes KEY=VALUE"):
        parser.parse_args(["--inner-opt", "size"])
    with pytest.raises(ValueError, match=r"^--size takes 1 or 2 values, got 3$"):
        _given(["--size", "1", "2", "3"])
    with pytest.raises(ValueError) as err:
        _given(["--size", "4", "--inner-opt", "size=5"])
    assert str(err.value) == "--size and --inner-opt size=... both set size; give it once"
    assert parser.parse_known_args(["--classes", "3"])[1] == ["--classes", "3"]  # no_flags


def test_ranges_are_checked_as_parsed_when_asked():
    """`check_ranges`: a number out of its option's range is refused by the parser, naming the
    flag; without it the config's own check refuses it when built."""
    assert _given(["--epochs", "0"]) == {"epochs": 0}
    parser = _parser(check_ranges=True)
    with pytest.raises(argparse.ArgumentError, match=r"^argument --epochs: must be >= 1, got 0$"):
        parser.parse_args(["--epochs", "0"])
    with pytest.raises(
        argparse.ArgumentError, match=r"^argument --rate: must be in \[0, 1\], got nan$"
    ):
        parser.parse_args(["--rate", "nan"])
    with pytest.raises(
        argparse.ArgumentError, match=r"^argument --size: must be in \[1, 64\], got 65$"
    ):
        parser.parse_args(["--size", "4", "65"])  # each item, of a nested config's option too
    with pytest.raises(
        argparse.ArgumentError, match=r"^argument --scale: must be a finite number > 0, got inf$"
    ):
        parser.parse_args(["--scale", "inf"])  # an open range holds inf: refused as such
    given = given_options(parser.parse_args(["--epochs", "2", "--size", "64"]), Job)
    assert given == {"epochs": 2, "inner": {"size": 64}}


def test_help_groups_defaults_and_notes():
    text = _parser(notes={"epochs": "recipes may change it"}).format_help()
    titles = [line for line in text.splitlines() if line.endswith(":") and " " in line]
    assert titles == ["main options:", "inner shape:", "inner other:", "how it runs:"]
    assert "passes (default: 10; recipes may change it)" in text
    assert "--crop MIN MAX" in text and "--no-crop             no crops" in text
    assert "--kind {x,y}" in text and "--size N [N ...]" in text
    main = text[text.index("main options:") : text.index("inner shape:")]
    assert "--inner-opt KEY=VALUE\n" in main and "an inner option by name" in main
    assert "--bias, --no-bias" in text
    assert "a kind\n" in text  # a nested option's default is not shown (a preset decides it)
    assert "--classes" not in text and "--extra N " in text  # a number's metavar is short
    hidden = _parser(exclude=("extra",), choices={"epochs": (1, 2)}).format_help()
    assert "--extra" not in hidden and "--epochs {1,2}" in hidden


# -- text values, close names and the type as a table shows it ---------------------------------


@pytest.mark.parametrize(
    "name, text, value",
    [
        ("size", "5", 5),
        ("size", "5,7", (5, 7)),
        ("size", "(5, 7)", (5, 7)),
        ("layers", "8,16", (8, 16)),
        ("layers", "8", (8,)),  # one item of a list
        ("layers", "", ()),
        ("scale", "0.5", 0.5),
        ("scale", "null", None),
        ("bias", "false", False),
        ("kind", "y", "y"),  # text the option takes as it is
        ("classes", "many", "many"),  # left for check_value to refuse
    ],
)
def test_text_takes_the_options_type(name, text, value):
    assert from_text(Inner, name, text) == value


def test_text_of_the_wrong_type_is_refused_by_the_check():
    with pytest.raises(TypeError, match=r"^size must be an integer or a list of 2 integers, got "):
        check_value(Inner, "size", from_text(Inner, "size", "5,x"))
    with pytest.raises(ValueError, match=r"^layers must be >= 1, got \(8, 0\)$"):
        check_value(Inner, "layers", from_text(Inner, "layers", "8,0"))


def test_close_names_prefer_what_the_name_begins():
    known = ("depth", "depths", "embed_dim", "drop_rate", "drop_path_rate")
    assert close_names("dep", known) == ["depth", "depths"]
    assert close_names("depht", known) == ["depth", "depths"]
    assert close_names("embeddim", known) == ["embed_dim"]
    assert close_names("zzz", known) == []


@pytest.mark.parametrize(
    "hint, text",
    [
        (int, "int"),
        (float | None, "float | None"),
        (tuple[int, int], "tuple[int, int]"),
        (int | tuple[int, ...], "int | tuple[int, ...]"),
    ],
)
def test_a_kind_spelled_as_a_table_shows_it(hint, text):
    assert kind_of(hint).spelled() == text


@dataclass(frozen=True, kw_only=True)
class Shared(Options):
    GROUPS = {"main": "main"}

    width: int = option(REQUIRED, "a width", group="main")


@dataclass(frozen=True, kw_only=True)
class Outer(Options):
    GROUPS = {"main": "main options", "run": "how it runs"}

    opts: dict[str, Any] = option({}, "any option", of=Shared, flag="opt", group="main")
    fast: bool = option(False, "go fast", group="run")


def test_a_dict_options_flags_join_the_group_of_the_same_key():
    parser = argparse.ArgumentParser(prog="job")
    add_flags(parser, Outer)
    text = parser.format_help()
    titles = [line for line in text.splitlines() if line.endswith(":") and line[0] != " "]
    assert titles == ["options:", "main options:", "how it runs:"]
    main = text[text.index("main options:") : text.index("how it runs:")]
    assert "--opt KEY=VALUE" in main and "--width N" in main
    args = parser.parse_args(["--width", "3", "--opt", "height=2"])
    assert given_options(args, Outer) == {"opts": {"width": 3, "height": 2}}
