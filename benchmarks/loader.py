"""Does the data loader keep up with training? Images/s of each, in one process.

    python benchmarks/loader.py                         # Fashion-MNIST with its preset
    python benchmarks/loader.py --data mnist-5k --batches 40 --json loader.json

The loader is timed alone (the training loader with the preset's augmentation, batches
collated, nothing else), then the model alone (forward, backward and AdamW step of the preset
model on one batch kept in memory), alternating round by round; medians over the rounds. The
loader runs in the training process (`--workers 0`, the default), so its time adds to the
model's: a loader N times faster than the model costs 1/N of the epoch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    from vitkit.train import make_loader, resolve_config, training_setup
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from vitkit.train import make_loader, resolve_config, training_setup


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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
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


if __name__ == "__main__":
    sys.exit(main())
