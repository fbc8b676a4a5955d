"""`vitkit shards`: an image folder written as tar shards in webdataset's layout, with the
info file (`_info.json`) that `--data wds:PATTERN` reads its sample counts and classes from."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import options
from .commands import add_command
from .output import plural
from .status import ExitCode


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "shards",
        description="Writes the images of FOLDER/<class>/<image> in a seeded random order "
        "(a stream is shuffled only through a buffer) as tar shards of KEY.<ext> and KEY.cls "
        "members, and the split in OUT's _info.json (timm's format, its other splits kept). "
        "The image files are copied, not decoded; each file is written atomically.",
    )
    p.add_argument("folder", metavar="FOLDER", help="class folders of images")
    p.add_argument(
        "pattern",
        metavar="OUT_PATTERN",
        help="the shard files, with a number field for the shard's number, e.g. "
        "shards/train-%%04d.tar",
    )
    p.add_argument(
        "--per-shard",
        type=options.int_in(1),
        default=1000,
        metavar="N",
        help="samples a shard holds (default: 1000)",
    )
    p.add_argument(
        "--split",
        default="train",
        metavar="NAME",
        help="the split's name in the info file: train, validation or test (default: train)",
    )
    p.add_argument(
        "--seed", type=options.int_in(0), default=0, help="the order of the samples (default: 0)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace shard files that exist (a file that is not a regular file never is)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..data.shards import write_shards

    bar = tqdm(desc="shards", unit="shard", leave=False, disable=not sys.stderr.isatty())

    def written_one(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    with bar:
        written = write_shards(
            args.folder,
            args.pattern,
            per_shard=args.per_shard,
            split=args.split,
            seed=args.seed,
            overwrite=args.overwrite,
            on_shard=written_one,
        )
    print(
        f"wrote {plural(len(written.files), 'shard')} of {plural(written.images, 'image')} "
        f"({plural(len(written.classes), 'class', 'classes')}) and {written.info}; read them "
        f"with --data 'wds:{written.pattern}'"
    )
    return ExitCode.OK
