"""`training_setup`: what `vitkit train` would train, built without training."""

from __future__ import annotations

import pytest

from vitkit.train import resolve_config, training_setup


def test_training_setup_builds_what_train_would_train():
    setup = training_setup(resolve_config({"data": "digits", "model_opts": {"depth": 1}}))
    assert setup.config.model == "vit_digits" and setup.config.epochs == 120
    assert setup.config.recipe == "small"
    assert (len(setup.train_set), len(setup.val_set), len(setup.test_set)) == (1259, 179, 359)
    assert setup.model.config.depth == 1 and tuple(setup.model.patch_embed.img_size) == (8, 8)
    image, label = setup.train_set[0]
    assert image.shape == (1, 8, 8) and 0 <= label < 10


def test_train_limit_takes_a_seeded_subset_of_the_training_images():
    full = training_setup(resolve_config({}))
    small = training_setup(resolve_config({"train_limit": 50}))
    again = training_setup(resolve_config({"train_limit": 50}))
    assert len(small.train_set) == 50 < len(full.train_set)
    assert (len(small.val_set), len(small.test_set)) == (len(full.val_set), len(full.test_set))
    labels = [small.train_set[i][1] for i in range(50)]
    assert labels == [again.train_set[i][1] for i in range(50)] and len(set(labels)) > 5


def test_the_in_chans_option_is_how_image_files_are_read(tmp_path, capsys):
    """Images are read with 1 or 3 channels (refused before anything is written); a built-in
    source has its own, which the option may not contradict."""
    from vitkit import cli
    from vitkit.train import resolve_config, training_setup

    code = cli.main(["train", "--in-chans", "2", "--out", str(tmp_path / "run")])
    assert code == 2 and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (
        "vitkit: error: in_chans 2: training reads images with 1 or 3 channels; choose one of "
        "them\n"
    )
    with pytest.raises(ValueError, match=r"^digits holds 1-channel images; the in_chans option"):
        training_setup(resolve_config({"model_opts": {"in_chans": 3}}))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"val_fraction": 0.0}, "the val split of digits holds no images; raise --val-fraction "
                                "(now 0) or add images"),
        ({"test_fraction": 0.0}, "the test split of digits holds no images; raise "
                                 "--test-fraction (now 0) or add images"),
    ],
)  # fmt: skip
def test_an_empty_val_or_test_split_is_refused_before_training(tmp_path, capsys, options, message):
    """The run would train, then fail at its first evaluation (or at the test) instead."""
    with pytest.raises(ValueError) as caught:
        training_setup(resolve_config({"model_opts": {"depth": 1}, **options}))
    assert str(caught.value) == message
    from vitkit import cli

    flag = next(iter(options)).replace("_", "-")
    code = cli.main(["train", f"--{flag}", "0", "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 2 and not (tmp_path / "run" / "model.safetensors").exists()
    assert capsys.readouterr().err.splitlines()[-1] == f"vitkit: error: {message}"
