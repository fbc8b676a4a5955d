"""Does the data loader keep up with training? Images/s of each, in one process.

    python benchmarks/loader.py                         # Fashion-MNIST with its preset
    python benchmarks/loader.py --data mnist-5k --batches 40 --json loader.json
    python benchmarks/loader.py --jpegs 200             # large photos, ViT-S/16 and ViT-B/16
    python benchmarks/loader.py --jpegs 8 --jpeg-size 400x300 --rounds 1   # a smoke run
    python benchmarks/loader.py --formats 2000 --jpeg-size 500x375  # folder, shards, Parquet
    python benchmarks/loader.py --start-up 1000000 --jpeg-size 500x375  # a folder of 1M files

With `--data`: the loader is timed alone (the training loader with the preset's augmentation,
batches collated, nothing else), then the model alone (forward, backward and AdamW step of the
preset model on one batch kept in memory), alternating round by round; medians over the rounds.
The loader runs in the training process (`--workers 0`, the default), so its time adds to the
model's: a loader N times faster than the model costs 1/N of the epoch.

With `--jpegs N`: a folder of N photo-like JPEGs (smooth colour waves, hard-edged rectangles,
sensor noise; `--jpeg-size`, quality 90) is made on the fly, and one loader worker's work is
timed: decode + the training augmentation (RandomResizedCrop, flip, RandAugment, erasing) or
the evaluation resize and crop (crop_pct 0.9, bicubic), each with reduced-scale JPEG decoding
(`draft`) off and on, on one thread as a DataLoader worker runs. Beside it, in the same rounds,
the training step (forward, backward, AdamW) of each model at `--train-batch`, fp32 and, where
the CPU has native bf16, under bf16 autocast, on `--threads` threads. The workers a machine of
C cores needs follow from the two rates, assuming one core per worker and a training step that
speeds up in proportion to the cores it gets (rate per core = measured rate / threads): w
workers keep up when w x worker rate >= (C - w) x model rate per core.

With `--formats N`: the same N photo-like JPEGs (two classes) as an image folder, as tar shards
(`vitkit shards`, 4 shards) and as a Parquet file (map-style `hfds:` and streamed `hfids:`,
when `datasets` is installed); a training epoch of each is read through the training loader
(decode, RandomResizedCrop and flip at `--img-size`, batches of `--train-batch`) with 0, 1
and 2 loader workers, alternating round by round; images/s, medians over the rounds.

With `--start-up N`: a folder of N files in 10 class folders, hard links to a few JPEGs (at
least 10, and one per 50,000 files: ext4 allows 65,000 links to a file), and the time `vitkit
train --data FOLDER` takes before its first step, in three parts measured one after the other:
listing the folder (`class_folders`), building the dataset (`load_data`: the listing again,
the header screening up to `folders.SCREEN_LIMIT` files, the split) and the first training
batch (`--train-batch` images decoded and augmented at `--img-size` in the training process,
`--workers 0`); the start-up is the last two (building lists the folder itself). The folder is
made in a temporary folder (`TMPDIR` picks the file system) and was just made, so its directory
entries are in the page cache: a cold cache adds the disk's time to read them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

try:
    from vitkit.train import make_loader, resolve_config, training_setup
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from vitkit.train import make_loader, resolve_config, training_setup
import vitkit  # noqa: E402
from vitkit.data import ImageFiles, Transformed, build_transform, eval_transform  # noqa: E402
from vitkit.data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig  # noqa: E402
from vitkit.train.optim import build_optimizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import environment, onednn_has_kernels  # noqa: E402

MACHINES = (2, 16)  # the core counts the worker estimate is printed for


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="data loader vs model training images/s for a source's preset",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data", default="fashion-mnist", help="a source with a preset")
    p.add_argument("--batches", type=int, default=60, help="batches per timed round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--json", help="also write the results here")
    jpegs = p.add_argument_group("large JPEGs (instead of --data)")
    jpegs.add_argument("--jpegs", type=int, default=0, help="how many JPEGs to make and time")
    jpegs.add_argument("--jpeg-size", default="2000x1500", help="WIDTHxHEIGHT of each")
    jpegs.add_argument("--img-size", type=int, default=224, help="the crop the model takes")
    jpegs.add_argument(
        "--models",
        default="vit_small_patch16_224,vit_base_patch16_224",
        help="comma-separated presets whose training step is timed",
    )
    jpegs.add_argument("--train-batch", type=int, default=32, help="batch of the training step")
    jpegs.add_argument(
        "--formats", type=int, default=0, help="time a folder, shards and Parquet of N JPEGs"
    )
    jpegs.add_argument(
        "--start-up",
        type=int,
        default=0,
        help="time listing, building and the first batch of a folder of N linked files",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.start_up:
        return start_up_main(args)
    if args.formats:
        return formats_main(args)
    if args.jpegs:
        return jpeg_main(args)
    # The same settings, data, model and transforms as `vitkit train --data DATA`.
    setup = training_setup(resolve_config({"data": args.data}))
    model, batch = setup.model, setup.config.batch_size
    loader = make_loader(setup.train_set, batch, train=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images, labels = next(iter(loader))

    def time_loader() -> float:
        start = time.perf_counter()
        for _ in itertools.islice(loader, args.batches):
            pass
        return args.batches * batch / (time.perf_counter() - start)

    def time_model() -> float:
        model.train()
        start = time.perf_counter()
        for _ in range(args.batches):
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return args.batches * batch / (time.perf_counter() - start)

    time_loader(), time_model()  # warm-up
    loader_rates, model_rates = [], []
    for _ in range(args.rounds):
        loader_rates.append(time_loader())
        model_rates.append(time_model())
    result = {
        "data": args.data,
        "model": setup.config.model,
        "batch_size": batch,
        "threads": torch.get_num_threads(),
        "loader_images_per_s": statistics.median(loader_rates),
        "model_train_images_per_s": statistics.median(model_rates),
    }
    result["ratio"] = result["loader_images_per_s"] / result["model_train_images_per_s"]
    print(
        f"{args.data}, {setup.config.model}, batch {batch}, {result['threads']} threads: "
        f"loader {result['loader_images_per_s']:.0f} images/s, model training "
        f"{result['model_train_images_per_s']:.0f} images/s; the loader is "
        f"{result['ratio']:.1f}x the model"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


# -- large JPEGs: one worker's decode + augment against the model's training step -----------


def photo(seed: int, width: int, height: int) -> Image.Image:
    """A photo-like image: smooth colour waves, a dozen hard-edged rectangles, sensor noise."""
    g = np.random.default_rng(seed)
    x = np.arange(width, dtype=np.float32)
    y = np.arange(height, dtype=np.float32)[:, None]
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, f = g.uniform(-1, 1, 3)
        img[..., c] = 128 + 40 * np.sin(a * x / (width / 7) + 6 * f) + 40 * np.sin(b * y / 200)
    for _ in range(12):
        x0, y0 = g.integers(0, width * 19 // 20), g.integers(0, height * 19 // 20)
        h, w = g.integers(height // 30, height // 3), g.integers(width // 30, width // 3)
        img[y0 : y0 + h, x0 : x0 + w] = g.uniform(0, 255, 3)
    img += g.normal(0, 6, img.shape).astype(np.float32)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def write_jpegs(folder: Path, count: int, width: int, height: int) -> list[tuple[str, int]]:
    samples = []
    for i in range(count):
        path = folder / f"{i:04d}.jpg"
        photo(i, width, height).save(path, "JPEG", quality=90)
        samples.append((str(path), 0))
    return samples


def pipelines(img_size: int) -> dict[str, Callable]:
    """'train' / 'eval' x draft off / on: vitkit's training augmentation and evaluation
    preparation at `img_size`, as `vitkit train` builds them for an image folder."""
    size = (img_size, img_size)
    config = DataConfig(
        input_size=(3, *size), mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.9
    )  # interpolation bicubic, crop_mode center: the ImageNet ViT weights'
    common = {"img_size": size, "mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    out = {}
    for draft in (False, True):
        tag = "on" if draft else "off"
        out[f"train, draft {tag}"] = build_transform(
            True, interpolation="bicubic", draft=draft, **common
        )
        out[f"eval, draft {tag}"] = eval_transform(config, draft=draft)
    return out


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def worker_step(dataset: Transformed) -> Callable[[], int]:
    """Decode and prepare every image once on one thread, as a DataLoader worker does."""

    def step() -> int:
        with threads(1):
            for i in range(len(dataset)):
                dataset[i]
        return len(dataset)

    return step


def training_step(name: str, dtype: str, batch: int, img_size: int) -> Callable[[], int]:
    """One forward, backward and AdamW step (vitkit's fused AdamW, as `vitkit train`), fp32 or
    under bf16 autocast."""
    model = vitkit.create_model(name, img_size=img_size).train()
    optimizer = build_optimizer(model, 1e-4, 0.05)
    x = torch.randn(batch, 3, img_size, img_size)
    target = torch.randint(0, model.config.num_classes, (batch,))
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> int:
        with cast:
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return batch

    return step


def workers_needed(worker_rate: float, model_per_core: float, cores: int) -> int:
    """Fewest workers w with w x worker_rate >= (cores - w) x model_per_core (one core each;
    the training step on the cores left); `cores` means none is left for training."""
    return math.ceil(cores * model_per_core / (worker_rate + model_per_core))


def jpeg_rounds(steps: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Images/s of every step, one warm-up round, then `rounds` rounds alternating the order."""
    rates: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for round_ in range(rounds + 1):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            count = steps[name]()
            if round_:
                rates[name].append(count / (time.perf_counter() - start))
    return rates


def jpeg_main(args: argparse.Namespace) -> int:
    width, height = (int(v) for v in args.jpeg_size.lower().split("x"))
    model_threads = torch.get_num_threads()
    dtypes = ["fp32"] + (["bf16"] if onednn_has_kernels(torch.bfloat16) else [])
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    with tempfile.TemporaryDirectory() as folder:
        samples = write_jpegs(Path(folder), args.jpegs, width, height)
        files = ImageFiles(samples)
        steps = {k: worker_step(Transformed(files, t)) for k, t in pipelines(args.img_size).items()}
        for name in models:
            for dtype in dtypes:
                steps[f"{name} {dtype}"] = training_step(
                    name, dtype, args.train_batch, args.img_size
                )
        rates = jpeg_rounds(steps, args.rounds)
    env = environment(torch.device("cpu"), argparse.Namespace(threads=None, no_timm=True))
    report = {
        "env": {**env, "threads": model_threads, "loader_threads_per_worker": 1},
        "images": {"count": args.jpegs, "width": width, "height": height, "quality": 90},
        "img_size": args.img_size,
        "train_batch": args.train_batch,
        "assumption": "one core per worker; the training step speeds up in proportion to the "
        "cores it gets (rate per core = measured rate / threads)",
        "worker_images_per_s": {},
        "model_train_images_per_s": {},
        "comparisons": [],
    }
    pipes = [k for k in steps if "draft" in k]
    for key in steps:
        where = "worker_images_per_s" if key in pipes else "model_train_images_per_s"
        report[where][key] = statistics.median(rates[key])
    for pipe in pipes:
        for key in report["model_train_images_per_s"]:
            per_round = [w / m for w, m in zip(rates[pipe], rates[key])]
            worker = report["worker_images_per_s"][pipe]
            per_core = report["model_train_images_per_s"][key] / model_threads
            report["comparisons"].append(
                {
                    "pipeline": pipe,
                    "model": key,
                    "worker_vs_model": statistics.median(per_round),
                    "workers": {str(c): workers_needed(worker, per_core, c) for c in MACHINES},
                }
            )
    print(render_jpegs(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def render_jpegs(report: dict) -> str:
    env, images = report["env"], report["images"]
    lines = [
        f"{env['date']} · {env['cpu']} ({env['cpu_capability']}; "
        f"{' '.join(env['cpu_flags']) or 'none of the bf16 / AMX flags'}) · {env['cpu_count']} "
        f"cores · torch {env['torch']} · training on {env['threads']} threads, each loader "
        "worker on 1",
        f"{images['count']} JPEGs of {images['width']}x{images['height']} (quality "
        f"{images['quality']}) to {report['img_size']} crops; training batch "
        f"{report['train_batch']}; medians over the alternating rounds",
        "",
        "| pipeline | images/s per worker |",
        "|---|---:|",
        *(f"| {k} | {v:.1f} |" for k, v in report["worker_images_per_s"].items()),
        "",
        "| model | training images/s | per core |",
        "|---|---:|---:|",
        *(
            f"| {k} | {v:.1f} | {v / env['threads']:.1f} |"
            for k, v in report["model_train_images_per_s"].items()
        ),
        "",
        f"Workers needed ({report['assumption']}):",
        "",
        "| pipeline | model | worker / model | "
        + " | ".join(f"{c} cores" for c in MACHINES)
        + " |",
        "|---|---|---:|" + "---:|" * len(MACHINES),
    ]
    for c in report["comparisons"]:
        workers = " | ".join(str(c["workers"][str(n)]) for n in MACHINES)
        lines.append(f"| {c['pipeline']} | {c['model']} | {c['worker_vs_model']:.2f} | {workers} |")
    return "\n".join(lines)


# -- formats: a folder, tar shards and Parquet of the same JPEGs through the training loader --


def write_formats(root: Path, count: int, width: int, height: int) -> dict[str, str]:
    """The same JPEGs (two classes) as a folder, shards and Parquet: format -> data spec."""
    from vitkit.data.shards import write_shards

    for label in range(2):
        (root / "folder" / f"class{label}").mkdir(parents=True)
    for i in range(count):
        photo(i, width, height).save(root / "folder" / f"class{i % 2}" / f"{i:05d}.jpg", quality=90)
    per_shard = max(1, math.ceil(count / 4))
    shards = write_shards(root / "folder", str(root / "shards" / "s-%02d.tar"), per_shard=per_shard)
    specs = {"folder": str(root / "folder"), "shards": f"wds:{shards.pattern}"}
    try:
        import datasets
    except ImportError:
        print("datasets is not installed: no Parquet")
        return specs
    table = datasets.load_dataset("imagefolder", data_dir=str(root / "folder"))["train"]
    table.to_parquet(str(root / "data.parquet"))
    specs["parquet (hfds)"] = f"hfds:{root / 'data.parquet'}"
    specs["parquet (hfids)"] = f"hfids:{root / 'data.parquet'}"
    return specs


def epoch_step(spec: str, workers: int, img_size: int, batch: int) -> Callable[[], int]:
    """One training epoch of `spec` through the training loader; returns the images read."""
    from vitkit.data import load_data, transformed

    splits = load_data(spec, val_fraction=0, test_fraction=0)
    size = (img_size, img_size)
    augment = build_transform(True, img_size=size, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    loader = make_loader(transformed(splits.train, augment), batch, train=True, num_workers=workers)

    def step() -> int:
        return sum(len(labels) for _, labels in loader)

    return step


def formats_main(args: argparse.Namespace) -> int:
    width, height = (int(v) for v in args.jpeg_size.split("x"))
    with tempfile.TemporaryDirectory() as folder:
        specs = write_formats(Path(folder), args.formats, width, height)
        steps = {
            (name, w): epoch_step(spec, w, args.img_size, args.train_batch)
            for name, spec in specs.items()
            for w in (0, 1, 2)
        }
        for step in steps.values():
            step()  # warm-up: file caches, imports
        rates: dict[tuple[str, int], list[float]] = {key: [] for key in steps}
        for _ in range(args.rounds):
            for key, step in steps.items():
                start = time.perf_counter()
                images = step()
                rates[key].append(images / (time.perf_counter() - start))
    env = environment(torch.device("cpu"), argparse.Namespace(threads=None, no_timm=True))
    report = {
        "env": env,
        "images": args.formats,
        "jpeg_size": args.jpeg_size,
        "img_size": args.img_size,
        "batch": args.train_batch,
        "torch_threads": torch.get_num_threads(),
        "images_per_s": {
            f"{name}, {w} workers": statistics.median(r) for (name, w), r in rates.items()
        },
    }
    print(f"{env['date']} · {env['cpu']} · {env['cpu_count']} cores · torch {env['torch']}")
    print(
        f"{args.formats} JPEGs of {args.jpeg_size}, training epoch at {args.img_size}px, "
        f"batch {args.train_batch}: images/s with 0 / 1 / 2 loader workers"
    )
    for name in specs:
        row = [f"{statistics.median(rates[(name, w)]):8.0f}" for w in (0, 1, 2)]
        print(f"  {name:16s}" + "".join(row))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


# -- start-up: a folder of N files (hard links to a few JPEGs) to its first training batch ---

CLASSES = 10  # class folders of the start-up folder
LINKS_PER_JPEG = 50_000  # under ext4's 65,000 hard links to one file


def link_folder(root: Path, count: int, jpegs: Sequence[Path]) -> None:
    """`count` files in CLASSES class folders of `root`, hard links to `jpegs` in turn."""
    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True)
    for i in range(count):
        os.link(jpegs[i % len(jpegs)], root / f"class{i % CLASSES}" / f"{i:07d}.jpg")


def start_up_times(folder: Path, img_size: int, batch: int) -> dict[str, float]:
    """Seconds to list `folder`, to build its training data, and to load the first batch."""
    from vitkit.data import load_data, transformed
    from vitkit.data.folders import class_folders

    start = time.perf_counter()
    class_folders(folder)
    listed = time.perf_counter()
    splits = load_data(str(folder))  # the default split, as `vitkit train --data FOLDER`
    built = time.perf_counter()
    size = (img_size, img_size)
    augment = build_transform(True, img_size=size, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    loader = make_loader(transformed(splits.train, augment), batch, train=True)
    next(iter(loader))
    first = time.perf_counter()
    return {"listing": listed - start, "dataset": built - listed, "first_batch": first - built}


def start_up_main(args: argparse.Namespace) -> int:
    from vitkit.data import folders

    width, height = (int(v) for v in args.jpeg_size.split("x"))
    count = args.start_up
    jpegs = max(CLASSES, math.ceil(count / LINKS_PER_JPEG))
    with tempfile.TemporaryDirectory() as tmp:
        sources = [Path(path) for path, _ in write_jpegs(Path(tmp), jpegs, width, height)]
        start = time.perf_counter()
        link_folder(Path(tmp) / "folder", count, sources)
        made = time.perf_counter() - start
        seconds = start_up_times(Path(tmp) / "folder", args.img_size, args.train_batch)
    env = environment(torch.device("cpu"), argparse.Namespace(threads=None, no_timm=True))
    report = {
        "env": env,
        "files": count,
        "jpegs": {"count": jpegs, "width": width, "height": height},
        "made_s": made,
        "screened": count <= folders.SCREEN_LIMIT,
        "screen_limit": folders.SCREEN_LIMIT,
        "img_size": args.img_size,
        "batch": args.train_batch,
        "seconds": seconds,
    }
    print(render_start_up(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def render_start_up(report: dict) -> str:
    env, jpegs, seconds = report["env"], report["jpegs"], report["seconds"]
    screened = "headers read" if report["screened"] else "listed only"
    rows = {
        "listing (class_folders)": seconds["listing"],
        "building the dataset (load_data)": seconds["dataset"],
        f"first training batch ({report['batch']} at {report['img_size']}px)": seconds[
            "first_batch"
        ],
        "start-up: building + first batch": seconds["dataset"] + seconds["first_batch"],
    }
    return "\n".join(
        [
            f"{env['date']} · {env['cpu']} · {env['cpu_count']} cores · torch {env['torch']}",
            f"a folder of {report['files']:,} files ({CLASSES} class folders, hard links to "
            f"{jpegs['count']} JPEGs of {jpegs['width']}x{jpegs['height']}, made in "
            f"{report['made_s']:.2f} s; {screened}, screening limit {report['screen_limit']:,})",
            *(f"  {name:40s}{value:8.2f} s" for name, value in rows.items()),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
