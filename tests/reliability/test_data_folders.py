"""Data folders as users make them: `--strict` refuses an unreadable image instead of skipping
it, symbolic links (a loop, a dangling link, a link to an image) neither hang nor break the
scan, the listing keeps `rglob`'s order, and a folder past the screening limit is listed only,
its unreadable images skipped and counted as an epoch meets them."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
from _run import TINY
from PIL import Image

from vitkit.data import folders, load_data


def _folder(root: Path, counts: dict[str, int]) -> Path:
    rng = np.random.default_rng(0)
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_strict_refuses_an_unreadable_image_that_is_otherwise_skipped(tmp_path, run_cli, caplog):
    root = _folder(tmp_path / "pets", {"cat": 12, "dog": 12})
    broken = root / "dog" / "broken.png"
    broken.write_bytes(b"not a png")
    argv = ["train", "--data", root, "--img-size", "8", "--epochs", "1", *TINY]
    code, _, err = run_cli(*argv, "--strict", "--out", tmp_path / "strict")
    assert code == 2 and err.startswith(f"vitkit: error: cannot read image {broken}: ")
    assert err.count("\n") == 1
    caplog.set_level(logging.INFO, logger="vitkit")
    code, _, err = run_cli(*argv, "--out", tmp_path / "lenient")
    assert code == 0, err
    said = [m for m in caplog.messages if "broken.png" in m]
    assert said == [
        f"data folder {root}: skipping 1 unreadable image: dog/broken.png (cannot "
        "identify image file)"
    ]  # once, up front; not again when an epoch meets it
    split = next(m for m in caplog.messages if m.startswith(f"data folder {root}: train"))
    assert sum(map(int, re.findall(r"\((\d+) images?\)", split))) == 24  # not 25


def test_symbolic_links_in_a_data_folder(tmp_path):
    root = _folder(tmp_path / "pets", {"cat": 3, "dog": 3})
    (root / "cat" / "loop").symlink_to(root)  # a folder that contains itself
    (root / "dog" / "gone.png").symlink_to(tmp_path / "nowhere.png")  # dangling
    (root / "dog" / "borrowed.png").symlink_to(root / "cat" / "0.png")  # a real image
    splits = load_data(str(root), val_fraction=0, test_fraction=0, img_size=(8, 8), in_chans=3)
    assert splits.class_names == ["cat", "dog"]
    assert len(splits.train) == 7  # 6 images and the linked one; no loop, no dangling link


def test_past_the_screening_limit_an_unreadable_image_is_skipped_when_read(
    tmp_path, run_cli, caplog, monkeypatch
):
    """A folder larger than `SCREEN_LIMIT` is listed, not screened (start-up does not grow
    with it beyond the listing); its unreadable file is met by the epoch, skipped and counted."""
    monkeypatch.setattr(folders, "SCREEN_LIMIT", 20)
    root = tmp_path / "pets"
    _folder(root / "train", {"cat": 12, "dog": 12})
    _folder(root / "val", {"cat": 2, "dog": 2})
    _folder(root / "test", {"cat": 2, "dog": 2})
    broken = root / "train" / "dog" / "broken.png"
    broken.write_bytes(b"not a png")
    read = []
    monkeypatch.setattr(folders, "unreadable_images", lambda paths: read.extend(paths) or {})
    caplog.set_level(logging.INFO, logger="vitkit")
    argv = ["train", "--data", root, "--img-size", "8", "--epochs", "1", *TINY]
    code, _, err = run_cli(*argv, "--out", tmp_path / "run")
    assert code == 0, err
    assert read == []  # no header read before the split
    assert (
        f"data folder {root}: 33 images, more than 20: headers not read before the "
        "split; an unreadable image is skipped and counted when it is read" in caplog.messages
    )
    split = next(m for m in caplog.messages if m.startswith(f"data folder {root}: train"))
    assert "train train/ (25 images), val val/ (4 images)" in split  # broken.png listed
    said = [m for m in caplog.messages if "broken.png" in m]
    assert said == [f"skipping an unreadable image: {broken} (cannot identify image file)"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [row.get("skipped_images") for row in rows] == [1]
    assert "skipped 1 unreadable training image(s)" in caplog.messages


def test_a_folder_of_up_to_screen_limit_files_is_screened(tmp_path, monkeypatch):
    root = _folder(tmp_path / "pets", {"cat": 2, "dog": 2})
    (root / "dog" / "broken.png").write_bytes(b"not a png")
    samples = [(str(path), 0) for path in sorted(root.rglob("*.png"))]
    monkeypatch.setattr(folders, "SCREEN_LIMIT", 5)
    found = folders.screen(samples, strict=False, root=root)
    assert found == {str(root / "dog" / "broken.png"): "cannot identify image file"}
    monkeypatch.setattr(folders, "SCREEN_LIMIT", 4)
    assert folders.screen(samples, strict=False, root=root) == {}


def test_a_folder_is_listed_as_sorted_rglob_lists_it(tmp_path):
    """`files_under` (os.scandir) gives the files, and the links to files, that `rglob` does in
    the same order, so a seeded split picks the same images as before it."""
    root = tmp_path / "cat"
    names = ["a.png", "a/b.png", "a-b.png", "A.png", "a/.h.png", ".hid/x.png", "z/y/x.jpg",
             "b c.png", "a.b/c.png", "é.png", "a0.png", "a/z/b.png", "a/a.png",
             "notes.txt"]  # fmt: skip
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    (root / "loop").symlink_to(root)
    (root / "a" / "up").symlink_to(root / "a.b")  # a link to a folder: not followed
    (root / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "linked.png").symlink_to(root / "a.png")
    os.mkfifo(root / "pipe.png")
    listed = [str(path) for path in sorted(root.rglob("*")) if path.is_file()]
    assert folders.files_under(root) == listed
    assert len(listed) == len(names) + 1  # and the link to a.png
