"""Tar shards in webdataset's layout: brace patterns, `write_shards` and its info file, the
reader's splits, webdataset's reading of them and theirs by vitkit, corrupt samples skipped
and counted up to 1 %, and the errors of missing shards and bad paths."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data import load_data, unreadable_files
from vitkit.data.images import DataError
from vitkit.data.shards import expand_pattern, write_shards
from vitkit.files import SpecialFileError


def image_folder(root: Path, per_class: int = 10, classes: tuple[str, ...] = ("cat", "dog")):
    """root/<class>/<i>.png: 6x5 RGB images of seeded noise."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture
def pets(tmp_path):
    return image_folder(tmp_path / "pets")


def test_brace_patterns_expand_as_webdatasets():
    assert expand_pattern("s/train-{0000..0002}.tar") == [
        "s/train-0000.tar",
        "s/train-0001.tar",
        "s/train-0002.tar",
    ]
    assert expand_pattern("{a,b}-{8..10}.tar") == [
        "a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar",
    ]  # fmt: skip
    assert expand_pattern("one.tar") == ["one.tar"]
    braceexpand = pytest.importorskip("braceexpand")
    for pattern in ("x-{000..012}.tar", "{a,b}/{1..3}-{07..09}"):
        assert expand_pattern(pattern) == list(braceexpand.braceexpand(pattern))


def test_a_folder_is_written_as_shards_with_timms_info_file(pets, tmp_path):
    written = write_shards(pets, str(tmp_path / "out" / "pets-%04d.tar"), per_shard=8)
    assert written.pattern == str(tmp_path / "out" / "pets-{0000..0002}.tar")
    assert (written.images, written.classes) == (20, ["cat", "dog"])
    info = json.loads((tmp_path / "out" / "_info.json").read_text())
    assert info == {
        "name": "pets",
        "splits": {
            "train": {
                "name": "train",
                "num_samples": 20,
                "filenames": ["pets-0000.tar", "pets-0001.tar", "pets-0002.tar"],
                "shard_lengths": [8, 8, 4],
            }
        },
        "classes": ["cat", "dog"],
    }
    with tarfile.open(written.files[0]) as tar:
        names = tar.getnames()
        assert names[:2] == ["00000000.png", "00000000.cls"] and len(names) == 16
        label = int(tar.extractfile("00000000.cls").read())
        image = tar.extractfile("00000000.png").read()
    # the files' bytes are copied: the sample is one of the folder's files, of its class
    sources = [p.read_bytes() for p in sorted((pets / ["cat", "dog"][label]).iterdir())]
    assert image in sources
    again = write_shards(pets, str(tmp_path / "again" / "pets-%04d.tar"), per_shard=8)
    assert [f.read_bytes() for f in again.files] == [f.read_bytes() for f in written.files]


def test_the_splits_are_cut_by_place_or_read_from_the_info_file(pets, tmp_path):
    train = write_shards(pets, str(tmp_path / "s" / "pets-train-%02d.tar"), per_shard=6)
    splits = load_data(f"wds:{train.pattern}", seed=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 2, 4)
    assert splits.class_names == ["cat", "dog"]
    keys = {name: [raw[0] for raw in getattr(splits, name).part(0, 1)] for name in
            ("train", "val", "test")}  # fmt: skip
    assert [len(k) for k in keys.values()] == [14, 2, 4]
    assert len(set().union(*keys.values())) == 20  # disjoint, covering every sample
    image, label = next(iter(splits.train))
    assert (image.mode, image.size, label in (0, 1)) == ("RGB", (5, 6), True)
    val = image_folder(tmp_path / "val", per_class=3)
    write_shards(val, str(tmp_path / "s" / "pets-validation-%02d.tar"), split="validation")
    splits = load_data(f"wds:{train.pattern}", seed=3)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (16, 6, 4)  # val: its own
    assert {raw[0].split(":")[0] for raw in splits.val.part(0, 1)} == {
        str(tmp_path / "s" / "pets-validation-00.tar")
    }


def test_without_an_info_file_the_shards_are_counted(pets, tmp_path):
    written = write_shards(pets, str(tmp_path / "s" / "p-%d.tar"), per_shard=8)
    os.remove(written.info)
    splits = load_data(f"wds:{written.pattern}")
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 2, 4)
    assert splits.class_names == ["0", "1"]  # the .cls indices; the names were in the info


@pytest.mark.requires("webdataset", extra="test")
def test_webdataset_reads_our_shards_and_we_read_its(pets, tmp_path):
    import webdataset as wds

    written = write_shards(pets, str(tmp_path / "s" / "p-%02d.tar"), per_shard=7)
    theirs = [(d["__key__"], int(d["cls"]), d["png"]) for d in
              wds.WebDataset(written.pattern, shardshuffle=False)]  # fmt: skip
    stream = load_data(f"wds:{written.pattern}", val_fraction=0, test_fraction=0).train
    ours = [(where.split(":")[1], int(cls), image) for where, image, cls in stream.part(0, 1)]
    assert ours == theirs and len(ours) == 20
    with wds.TarWriter(str(tmp_path / "w-0.tar")) as sink:
        for i in range(4):
            png = io.BytesIO()
            Image.new("L", (3, 2), color=i * 60).save(png, format="PNG")
            sink.write({"__key__": f"sample{i}", "png": png.getvalue(), "cls": i % 2})
    stream = load_data(f"wds:{tmp_path}/w-{{0..0}}.tar", val_fraction=0, test_fraction=0).train
    assert [(img.getpixel((0, 0)), label) for img, label in stream] == [
        ((0, 0, 0), 0), ((60, 60, 60), 1), ((120, 120, 120), 0), ((180, 180, 180), 1),
    ]  # fmt: skip


def _shard_with_corrupt(path: Path, count: int, corrupt: set[int]) -> None:
    """`count` samples, those in `corrupt` with bytes that are no image."""
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            png = io.BytesIO()
            Image.new("L", (2, 2), color=i % 256).save(png, format="PNG")
            data = b"not an image" if i in corrupt else png.getvalue()
            for name, content in ((f"{i:04d}.png", data), (f"{i:04d}.cls", str(i % 2).encode())):
                member = tarfile.TarInfo(name)
                member.size = len(content)
                tar.addfile(member, io.BytesIO(content))


def test_a_corrupt_sample_is_skipped_and_counted_up_to_one_percent(tmp_path):
    _shard_with_corrupt(tmp_path / "a-0.tar", 200, {17})
    stream = load_data(f"wds:{tmp_path}/a-{{0..0}}.tar", val_fraction=0, test_fraction=0).train
    assert len(stream) == 200 and len(list(stream)) == 199
    assert unreadable_files(stream) == {f"{tmp_path}/a-0.tar:0017": "cannot identify image file"}
    _shard_with_corrupt(tmp_path / "b-0.tar", 200, {3, 50, 99})  # 1.5 %
    stream = load_data(f"wds:{tmp_path}/b-{{0..0}}.tar", val_fraction=0, test_fraction=0).train
    with pytest.raises(DataError, match=r"^3 of the 200 samples of these shards are unreadable "
                       r"\(more than 1%\), the first .*b-0.tar:0099"):  # fmt: skip
        list(stream)
    strict = load_data(
        f"wds:{tmp_path}/b-{{0..0}}.tar", val_fraction=0, test_fraction=0, skip_corrupt=False
    ).train
    with pytest.raises(DataError, match="b-0.tar:0003: .*; drop --strict to skip"):
        list(strict)


def test_a_shard_cut_short_is_counted_and_the_next_read(tmp_path):
    _shard_with_corrupt(tmp_path / "c-0.tar", 150, set())
    _shard_with_corrupt(tmp_path / "c-1.tar", 150, set())
    stream = load_data(f"wds:{tmp_path}/c-{{0..1}}.tar", val_fraction=0, test_fraction=0).train
    whole = (tmp_path / "c-0.tar").read_bytes()  # counted whole, then cut short
    (tmp_path / "c-0.tar").write_bytes(whole[: len(whole) // 2 + 100])  # in the middle of a member
    items = list(stream)
    assert 150 < len(items) < 300  # the first shard's start, then the second whole
    skipped = unreadable_files(stream)  # the sample cut in two, and the shard
    assert list(skipped)[-1] == f"{tmp_path}/c-0.tar"
    assert (
        skipped[f"{tmp_path}/c-0.tar"] == f"it ends after {len(items) - 150 + 1} of its 150 samples"
    )


def test_missing_shards_and_bad_patterns_are_one_line(tmp_path, capsys):
    assert main(["train", "--data", f"wds:{tmp_path}/x-{{0..3}}.tar", "--model",
                 "vit_digits", "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err == (
        f"vitkit: error: shard {tmp_path}/x-0.tar does not exist (4 of the 4 shards of "
        f"{tmp_path}/x-{{0..3}}.tar are missing); write shards with vitkit shards FOLDER PATTERN"
    )
    image_folder(tmp_path / "pets", per_class=2)
    assert main(["shards", str(tmp_path / "pets"), str(tmp_path / "p.tar")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"vitkit: error: shard pattern '{tmp_path}/p.tar' needs one number field such as %04d "
        "for the shard's number, e.g. shards/train-%04d.tar"
    )


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("s/t-{0000..}.tar", "shard pattern 's/t-{0000..}.tar': {0000..} is neither a range of "
                             "whole numbers such as {0000..0127} nor a list such as {a,b}"),
        ("s/t-{}.tar", "shard pattern 's/t-{}.tar': {} is neither a range"),
        ("s/t-{0000..0002.tar", "shard pattern 's/t-{0000..0002.tar' has an unmatched {; write a "
                                "range such as train-{0000..0127}.tar or a list such as {a,b}"),
        ("s/t-}0.tar", "shard pattern 's/t-}0.tar' has an unmatched }; write a range"),
        ("s/{0..9999}-{0..9999}.tar", "shard pattern 's/{0..9999}-{0..9999}.tar' names "
                                      "100,000,000 shards, more than 1,000,000; check its range"),
    ],
)  # fmt: skip
def test_a_malformed_or_runaway_brace_pattern_is_one_line(pattern, message):
    with pytest.raises(DataError) as caught:
        expand_pattern(pattern)
    assert str(caught.value).startswith(message)


def test_a_folder_or_shards_without_samples_are_one_line(tmp_path):
    with tarfile.open(tmp_path / "empty-0.tar", "w"):
        pass
    with pytest.raises(DataError) as caught:
        load_data(f"wds:{tmp_path / 'empty-0.tar'}")
    assert str(caught.value) == (
        f"the shards of {tmp_path / 'empty-0.tar'} hold no samples; write shards with vitkit "
        "shards FOLDER PATTERN"
    )
    os.mkfifo(tmp_path / "fifo-1.tar")
    with pytest.raises(DataError) as caught:
        load_data(f"wds:{tmp_path}/fifo-{{1..1}}.tar")
    assert str(caught.value) == (
        f"shard {tmp_path}/fifo-1.tar is a FIFO (named pipe), not a tar file; name the shard files"
    )
    with pytest.raises(DataError) as caught:
        load_data(f"wds:{tmp_path}")
    assert str(caught.value) == (
        f"{tmp_path} is a folder; name its shards with a brace pattern, e.g. --data "
        f"'wds:{tmp_path}/train-{{0000..0009}}.tar'"
    )


def test_the_command_writes_shards_and_never_replaces_a_special_file(pets, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["shards", str(pets), str(out / "p-%03d.tar"), "--per-shard", "16"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote 2 shards of 20 images (2 classes) and {out}/_info.json; read them with "
        f"--data 'wds:{out}/p-{{000..001}}.tar'"
    )
    os.mkfifo(out / "q-001.tar")
    with pytest.raises(SpecialFileError):
        write_shards(pets, str(out / "q-%03d.tar"), per_shard=16)
    assert not (out / "q-000.tar").exists() and not (out / "q-001.tar").is_file()


def test_a_shard_file_that_exists_is_replaced_only_with_overwrite(pets, tmp_path, capsys):
    mine = tmp_path / "p-0.tar"
    mine.write_text("a file of the user's")
    assert main(["shards", str(pets), str(tmp_path / "p-%d.tar"), "--per-shard", "16"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"vitkit: error: {mine} exists (1 of the 2 shard files); pass --overwrite to replace "
        "them, or choose another OUT_PATTERN"
    )
    assert mine.read_text() == "a file of the user's" and not (tmp_path / "p-1.tar").exists()
    assert main(["shards", str(pets), str(tmp_path / "q-%d.tar"), "--split", " "]) == 2
    assert capsys.readouterr().err.strip() == (
        "vitkit: error: the split's name is empty; name it train, validation or test"
    )
    argv = ["shards", str(pets), str(tmp_path / "p-%d.tar"), "--per-shard", "16", "--overwrite"]
    assert main(argv) == 0
    assert tarfile.is_tarfile(mine) and tarfile.is_tarfile(tmp_path / "p-1.tar")


def test_a_run_without_a_model_is_sized_to_the_first_images_of_the_shards(pets, tmp_path):
    from vitkit.train.recipes import default_choice

    written = write_shards(pets, str(tmp_path / "s" / "p-%d.tar"), per_shard=8)
    choice = default_choice(f"wds:{written.pattern}")
    assert (choice.model, choice.seen) == ("vit_digits", "20 RGB images, median 5x6")
    assert choice.model_opts == {"img_size": 6, "in_chans": 3}
