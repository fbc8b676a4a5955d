"""Every reader under torchrun (2 processes, gloo): an image folder, a file list (`list:`), a
Parquet file map-style (`hfds:`) and streamed (`hfids:`), and tar shards (`wds:`) each give
the two ranks' training loaders disjoint samples that together cover the epoch.

The 41 samples do not divide between 2 ranks: each reads 21 (equal steps), so one sample is
read twice in the epoch and no other. That is the padding: a map-style dataset's as PyTorch's
DistributedSampler pads (the first of the shuffled order again, on the last rank), a stream's
a rank whose part ends sooner reading its own part again.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from _helpers import torchrun
from vitkit.data.shards import write_shards

COUNT = 41  # odd: the ranks' shares need padding
RANKS = 2
HF = pytest.mark.requires("datasets", extra="datasets")
READERS = [
    "folder",
    "list",
    pytest.param("hfds", marks=HF),
    pytest.param("hfids", marks=HF),
    "wds",
]

# One epoch of each data spec through `make_loader` on this rank (2 loader workers), the
# numbers it read written to seen{RANK}.json.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from vitkit.data import load_data, transformed
    from vitkit.train import make_loader
    from vitkit.train.distributed import set_epoch

    def number(image):
        red, green, _ = image.getpixel((0, 0))
        return torch.tensor(red + 256 * green)

    number.full_resolution = True  # image files as PIL images, as vitkit's transforms take

    dist.init_process_group("gloo")
    out, specs = sys.argv[1], sys.argv[2:]
    seen = {}
    for spec in specs:
        train = load_data(spec, val_fraction=0, test_fraction=0).train
        loader = make_loader(transformed(train, number), 8, train=True, num_workers=2)
        set_epoch(loader, 1)
        seen[spec] = [int(n) for numbers, _ in loader for n in numbers]
    with open(os.path.join(out, f"seen{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
    """
)


def numbered_images(folder: Path, count: int) -> list[tuple[str, int]]:
    """`count` 4x4 PNGs in class folders even/ and odd/, image i's number in its pixels' red
    and green; (path relative to `folder`, label) of each."""
    samples = []
    for i in range(count):
        name = f"{('even', 'odd')[i % 2]}/{i:03d}.png"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i % 256, i // 256, 0)).save(folder / name)
        samples.append((name, i % 2))
    return samples


def write_parquet(folder: Path, samples: list[tuple[str, int]], out: Path) -> None:
    """The images as a Parquet file: an `Image` column of PNG bytes, a `ClassLabel`."""
    import datasets

    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["even", "odd"])}
    )
    rows = {
        "img": [{"bytes": (folder / name).read_bytes(), "path": None} for name, _ in samples],
        "label": [label for _, label in samples],
    }
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(out))


def data_specs(root: Path) -> dict[str, str]:
    """The same COUNT numbered images in each reader's format: reader -> data spec."""
    folder = root / "images"
    samples = numbered_images(folder, COUNT)
    listed = "path,label\n" + "".join(f"{name},{('even', 'odd')[y]}\n" for name, y in samples)
    (folder / "list.csv").write_text(listed)
    shards = write_shards(folder, str(root / "shards" / "s-%02d.tar"), per_shard=21)
    specs = {"folder": str(folder), "list": f"list:{folder / 'list.csv'}"}
    specs["wds"] = f"wds:{shards.pattern}"
    if importlib.util.find_spec("datasets") is not None:
        write_parquet(folder, samples, root / "data.parquet")
        specs["hfds"] = f"hfds:{root / 'data.parquet'}"
        specs["hfids"] = f"hfids:{root / 'data.parquet'}"
    return specs


@pytest.fixture(scope="module")
def seen_by_rank(tmp_path_factory) -> tuple[dict[str, str], list[dict[str, list[int]]]]:
    """One torchrun of every reader (one start-up of 2 processes for all): the specs, and
    per rank the sample numbers its loader gave for each spec."""
    root = tmp_path_factory.mktemp("readers")
    specs = data_specs(root)
    script = root / "readers_ddp.py"
    script.write_text(SCRIPT)
    proc = torchrun(str(script), str(root), *specs.values(), cwd=root)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-1500:]
    return specs, [json.loads((root / f"seen{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.slow  # one torchrun of 2 processes for all five readers, about 20 s on 2 busy cores
@pytest.mark.parametrize("reader", READERS)
def test_each_rank_reads_its_own_samples_and_together_the_epoch(seen_by_rank, reader):
    specs, seen = seen_by_rank
    first, second = (rank[specs[reader]] for rank in seen)
    assert len(first) == len(second) == 21  # ceil(41 / 2): equal steps
    assert sorted(set(first) | set(second)) == list(range(COUNT))
    reads = Counter(first + second)
    assert sorted(reads.values()) == [1] * (COUNT - 1) + [2]  # the padding read, no other
    if reader in ("hfids", "wds"):  # a stream pads a rank with its own samples
        assert not set(first) & set(second)
