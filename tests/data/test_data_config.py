"""`DataConfig`: how images are prepared for a model's weights, declared with `option()` so that
its flags (--mean, --std, --crop-pct, --interpolation, --crop-mode) come from its fields."""

from __future__ import annotations

import argparse

import pytest

from vitkit.data.data_config import DataConfig, data_config_flags
from vitkit.options.flags import given_options

BASE = DataConfig(input_size=(3, 8, 8), mean=0.5, std=(0.2, 0.3, 0.4))


def test_one_value_holds_for_every_channel_and_is_stored_per_channel():
    assert BASE.mean == (0.5, 0.5, 0.5) and BASE.std == (0.2, 0.3, 0.4)
    assert DataConfig.from_dict(BASE.to_dict()) == BASE
    assert BASE.to_dict()["input_size"] == [3, 8, 8] and BASE.img_size == (8, 8)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"mean": (0.5, 0.5)}, ValueError, "mean must be 3 finite numbers (one per channel)"),
        ({"std": (0.2, 0.0, 0.4)}, ValueError, "std must be > 0, got (0.2, 0.0, 0.4)"),
        ({"crop_pct": 0}, ValueError, "crop_pct must be in (0, 1], got 0"),
        ({"crop_mode": "border"}, ValueError, "unknown crop_mode 'border'; expected one of"),
        ({"input_size": (3, 8)}, TypeError, "input_size must be a list of 3 integers, got"),
        ({"interp": "bilinear"}, TypeError, "unknown data-config key 'interp' (did you mean"),
    ],
)
def test_each_field_is_checked_in_one_line(changes, error, message):
    with pytest.raises(error) as err:
        BASE.replace(**changes)
    assert str(err.value).startswith(message)


def test_replace_ignores_what_was_not_given():
    assert BASE.replace(mean=None, crop_pct=0.9) == DataConfig(
        input_size=(3, 8, 8), mean=0.5, std=(0.2, 0.3, 0.4), crop_pct=0.9
    )


def test_its_flags_override_a_weights_data_config():
    parser = argparse.ArgumentParser()
    data_config_flags(parser)
    help_text = parser.format_help()
    assert "image preparation (default: the weights'):" in help_text
    assert "--input-size" not in help_text and "--crop-pct X" in help_text
    assert "--interpolation {nearest,bilinear,bicubic,lanczos}" in help_text
    args = parser.parse_args(["--mean", "0.4", "--std", "0.1", "0.2", "0.3", "--crop-pct", "0.9"])
    given = given_options(args, DataConfig)
    assert given == {"mean": 0.4, "std": (0.1, 0.2, 0.3), "crop_pct": 0.9}
    changed = BASE.replace(**given)
    assert (changed.mean, changed.std, changed.crop_pct) == ((0.4,) * 3, (0.1, 0.2, 0.3), 0.9)
    assert given_options(parser.parse_args([]), DataConfig) == {}
