"""Writers never replace a special file: `atomic_write` replaces only a regular file or a new
path, follows symbolic links, writes through a character device and refuses the rest in one
line; its temporary names fit the file system's name limit."""

from __future__ import annotations

import os
import re
import socket
import stat
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit import cli, create_model
from vitkit.explain import attention_maps, draw_explanation
from vitkit.files import SpecialFileError, atomic_write, remove_stale_temp_files, require_regular
from vitkit.plots import plot_confusion, plot_curves

PNG = b"\x89PNG\r\n\x1a\n"


def _device_node(path: Path, kind: int = stat.S_IFCHR, numbers: tuple[int, int] = (1, 3)) -> Path:
    """A scratch device node (by default a second /dev/null); skips where mknod is refused."""
    try:
        os.mknod(path, kind | 0o600, os.makedev(*numbers))
    except PermissionError as err:
        pytest.skip(f"cannot create a device node here ({err}); needs root or CAP_MKNOD")
    return path


def _socket(path: Path) -> Path:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays
    return path


def _write(text: bytes = b"new"):
    return lambda f: f.write(text)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


SPECIAL = {
    "fifo": (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),
    "socket": (_socket, "a socket"),
    "folder": (lambda p: p.mkdir(), "a folder"),
    "block device": (lambda p: _device_node(p, stat.S_IFBLK, (7, 200)), "a block device"),
}


@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_are_refused_in_one_line_and_left_alone(tmp_path, kind):
    make, what = SPECIAL[kind]
    path = tmp_path / "out.png"
    make(path)
    before = os.lstat(path)
    with pytest.raises(SpecialFileError) as err:
        atomic_write(path, _write())
    assert str(err.value) == (
        f"cannot write {path}: it is {what}, not a regular file; name a new or regular file instead"
    )
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert _names(tmp_path) == ["out.png"]  # no temporary file left


def test_a_character_device_is_written_through_never_replaced(tmp_path):
    null = _device_node(tmp_path / "null")
    before = os.lstat(null)
    atomic_write(null, _write(b"x" * 100_000))
    atomic_write(null, lambda f: f.write("text"), mode="w")
    after = os.lstat(null)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert after.st_rdev == os.makedev(1, 3)
    assert _names(tmp_path) == ["null"]


def test_the_systems_dev_null_stays_a_device():
    atomic_write("/dev/null", _write())
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_link_to_a_regular_file_stays_a_link_and_its_target_is_replaced(tmp_path):
    target = tmp_path / "real.png"
    target.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to("real.png")
    old_inode = target.stat().st_ino
    atomic_write(link, _write())
    assert link.is_symlink() and os.readlink(link) == "real.png"
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != old_inode  # replaced by a rename: readers saw it whole
    assert _names(tmp_path) == ["link.png", "real.png"]


def test_a_dangling_link_gets_its_target_created(tmp_path):
    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "sub" / "made.png")
    atomic_write(link, _write())
    assert link.is_symlink() and (tmp_path / "sub" / "made.png").read_bytes() == b"new"


def test_links_to_special_files_follow_the_same_rules(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "to_fifo.png"
    to_fifo.symlink_to(fifo)
    with pytest.raises(SpecialFileError, match=rf"^cannot write {to_fifo}: it is a FIFO \(named "):
        atomic_write(to_fifo, _write())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and to_fifo.is_symlink()
    null = _device_node(tmp_path / "null")
    to_null = tmp_path / "to_null.png"
    to_null.symlink_to(null)
    atomic_write(to_null, _write())
    assert stat.S_ISCHR(os.lstat(null).st_mode) and to_null.is_symlink()
    loop = tmp_path / "loop.png"
    loop.symlink_to("loop.png")
    with pytest.raises(SpecialFileError, match="it is a loop of symbolic links"):
        atomic_write(loop, _write())
    assert loop.is_symlink()


@pytest.mark.parametrize("name", ["a" * 246 + ".png", "b" * 255, "é" * 127])
def test_a_long_legal_name_works_and_its_temporary_name_fits(tmp_path, name):
    path = tmp_path / name
    seen = []

    def write(f):
        seen.extend(_names(tmp_path))
        f.write(b"data")

    atomic_write(path, write)
    assert path.read_bytes() == b"data" and _names(tmp_path) == [name]
    (temp,) = seen
    assert len(os.fsencode(temp)) <= 255 and temp.startswith(".") and temp.endswith(".tmp")
    assert re.fullmatch(r"\..+\.vitkit-[a-z0-9_]{8}\.tmp", temp)
    (tmp_path / temp).write_bytes(b"left by a killed write")  # the clean-up finds it
    assert remove_stale_temp_files(tmp_path) == [tmp_path / temp]


def test_only_a_regular_file_counts_as_one_vitkit_may_remove(tmp_path):
    (tmp_path / "old.png").write_bytes(b"old")
    (tmp_path / "link.png").symlink_to(tmp_path / "old.png")
    assert require_regular(tmp_path / "old.png") and not require_regular(tmp_path / "new.png")
    specials = {**SPECIAL, "chr": (_device_node, "a character device")}
    for kind, (make, what) in specials.items():
        path = tmp_path / kind
        make(path)
        with pytest.raises(SpecialFileError) as err:
            require_regular(path, role="a run file")
        assert str(err.value) == (
            f"{path} is {what}, not a run file; vitkit never removes or replaces it: move it "
            "away or choose another folder"
        )
        os.lstat(path)  # still there
    with pytest.raises(SpecialFileError, match="is a symbolic link, not a file vitkit writes"):
        require_regular(tmp_path / "link.png")  # the link is not followed
    assert _names(tmp_path) == sorted([*specials, "link.png", "old.png"])


# -- end to end: the pictures ---------------------------------------------------------------


def _maps():
    torch.manual_seed(0)
    model = create_model("vit_digits", embed_dim=16, depth=1, num_heads=2)
    images = torch.rand(1, 1, 8, 8)
    return images[0], {k: v[0] for k, v in attention_maps(model, images).items()}


def test_explain_drawing_never_replaces_a_special_file(tmp_path):
    image, maps = _maps()
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError, match="it is a FIFO"):
        draw_explanation(image, maps, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    null = _device_node(tmp_path / "null.png")
    draw_explanation(image, maps, null)
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    draw_explanation(image, maps, tmp_path / ("c" * 246 + ".png"))
    assert (tmp_path / ("c" * 246 + ".png")).read_bytes()[:8] == PNG


def test_the_run_pictures_never_replace_a_special_file(tmp_path):
    history = [dict(epoch=1, train_loss=1.0, val_loss=1.1, val_acc1=0.5, val_acc5=0.9)]
    for draw in (
        lambda path: plot_curves(history, path),
        lambda path: plot_confusion(torch.tensor([[3, 1], [0, 4]]), ["cat", "dog"], path),
    ):
        fifo = tmp_path / "fifo.png"
        os.mkfifo(fifo)
        with pytest.raises(SpecialFileError, match="it is a FIFO"):
            draw(fifo)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
        fifo.unlink()
        null = _device_node(tmp_path / "null.png")
        draw(null)
        assert stat.S_ISCHR(os.lstat(null).st_mode)
        null.unlink()


def test_eval_never_replaces_a_special_file(tmp_path, capsys):
    """`vitkit eval --confusion PATH`: a FIFO is refused (exit 2, one line), a character
    device is written through, a 250-character name works."""
    torch.manual_seed(0)
    model = create_model("vit_digits", embed_dim=16, depth=1, num_heads=2)
    checkpoint = str(tmp_path / "model.safetensors")
    vitkit.save(model, checkpoint, meta={"class_names": [str(i) for i in range(10)]})
    argv = ["eval", "--checkpoint", checkpoint, "--data", "digits", "--confusion"]
    fifo = tmp_path / "confusion.png"
    os.mkfifo(fifo)
    assert cli.main([*argv, str(fifo)]) == 2
    assert capsys.readouterr().err == (
        f"vitkit: error: cannot write {fifo}: it is a FIFO (named pipe), not a regular file; "
        "name a new or regular file instead\n"
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    null = _device_node(tmp_path / "null")
    assert cli.main([*argv, str(null)]) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    long = tmp_path / ("d" * 246 + ".png")
    assert cli.main([*argv, str(long)]) == 0
    assert long.read_bytes()[:8] == PNG
