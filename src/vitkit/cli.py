"""The `vitkit` command line: each subcommand parses its arguments and calls the library."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.utils.data import ConcatDataset

from . import data as data_lib
from .data.data_config import DataConfig
from .explain import attention_maps, draw_explanation, readout_of
from .files import DiskFullError
from .model import VisionTransformer, ViTConfig, registry
from .model.precision import PRECISIONS, set_precision
from .options import read_settings
from .options.flags import add_flags, given_options
from .plots import plot_confusion
from .summary import summary
from .train import evaluate, make_loader, predict, resolve_config, run_training
from .train.config import JobConfig, PretrainConfig, TrainConfig, resolve_device
from .train.distributed import world
from .train.fit import Progress
from .train.recipes import RECIPE_OPTIONS, RECIPES, default_model
from .train.run_folder import default_out, read_run_config
from .weights import load

log = logging.getLogger("vitkit")


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (`UserError`) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
        raise UserError(f"{message}; see `{self.prog} --help`")


def _int_in(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`, else one line naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


# -- train / eval / predict / explain handlers ---------------------------------------------


def _progress(enabled: bool) -> Progress:
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


def _resumed_config(out: Path, given: dict[str, Any], job: type[JobConfig]) -> JobConfig:
    """The run's own settings with the options given again (model options key by key);
    `run_training` / `run_pretraining` check what may change on a resume."""
    saved = read_run_config(out, job)
    if "model_opts" in given:
        given = {**given, "model_opts": {**saved.model_opts, **given["model_opts"]}}
    return saved.replace(**given)


def _run_config(
    args: argparse.Namespace, name_of: Callable[[str], str | None] = lambda data: None
) -> tuple[JobConfig, Path]:
    """The settings and folder of a `train` / `pretrain` run: the saved settings on --resume,
    else the options over --config over the recipe. Without --out the folder is
    `runs/<--name>`, else `runs/<name_of(data)>`, else `runs/<data>-<model>`, the same
    whether the run starts or resumes."""
    job = args.job
    given = given_options(args, job)
    if args.resume:
        data = given.get("data", job.data)
        model = given.get("model") or default_model(data)
    else:
        settings = getattr(args, "config", None)
        values = read_settings(settings, job, source=f"--config {settings}") if settings else {}
        config = resolve_config(given, values, job)
        data, model = config.data, config.model
    out = Path(args.out) if args.out else default_out(data, model, args.name or name_of(data))
    return (_resumed_config(out, given, job) if args.resume else config), out


def _cmd_train(args: argparse.Namespace) -> int:
    if args.resume and args.config:
        raise UserError(
            "--config starts a new run from a settings file; --resume continues with the "
            "settings in the run's config.json: drop one of them"
        )
    config, out = _run_config(args)
    outcome = run_training(
        config,
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=_progress(not args.no_progress),
    )
    if outcome.test is None:
        if outcome.rank == 0:
            print(f"interrupted; continue with: vitkit train --out {out} --resume", file=sys.stderr)
        return 130
    if outcome.rank == 0:
        result = outcome.result
        print(f"best val top-1 {result.best:.4f} at epoch {result.best_epoch}; files in {out}")
        print(f"test accuracy: {outcome.test['acc1']:.4f}")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from .train.pretrain import run_pretraining
    from .train.run_folder import ENCODER_FILE

    config, out = _run_config(args, name_of=lambda data: f"mae-{Path(data).name}")
    result = run_pretraining(
        config, out, resume=args.resume, overwrite=args.overwrite,
        progress=_progress(not args.no_progress),
    ).result  # fmt: skip
    if result.interrupted:
        if world()[0] == 0:
            print(f"interrupted; continue with: vitkit pretrain --out {out} --resume",
                  file=sys.stderr)  # fmt: skip
        return 130
    history = result.history
    final = f"loss {history[-1]['train_loss']:.4f}; " if history else ""
    if world()[0] == 0:
        print(f"{final}encoder in {out / ENCODER_FILE}: fine-tune it with --pretrained")
    return 0


def _json(value: Any) -> str:
    """Strict JSON: a NaN or infinity is an error, never an invalid document."""
    return json.dumps(value, allow_nan=False)


def _checkpoint_model(path: str, device: str, precision: str = "fp32") -> VisionTransformer:
    model = load(path, map_location=device)
    if not model.meta.get("class_names"):
        log.warning("%s has no class names in its metadata; printing class indices", path)
    set_precision(model, precision)
    return model


def _data_config(model: torch.nn.Module) -> DataConfig:
    """How a checkpoint's inputs are prepared: its data config, or for files written before
    data configs a squash to the model's size with 0.5 / 0.5 normalisation."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    height, width = model.patch_embed.img_size
    return DataConfig(input_size=(model.config.in_chans, height, width), mean=0.5, std=0.5,
                      interpolation="bilinear", crop_mode="squash")  # fmt: skip


def _eval_transform(model: torch.nn.Module):
    """The model's evaluation pipeline: resize, centre crop and normalise as its data config
    says (timm's eval transform)."""
    return data_lib.eval_transform(_data_config(model))


def _model_inputs(model: torch.nn.Module, paths: Sequence[str]) -> torch.Tensor:
    """Image files decoded at full resolution (EXIF orientation applied) and prepared as the
    model's data config says: (B, C, H, W), normalised."""
    config = _data_config(model)
    prepare = data_lib.eval_transform(config)
    chans = config.input_size[0]
    return torch.stack([prepare(data_lib.open_image(p, in_chans=chans)) for p in paths])


def _cmd_eval(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model = _checkpoint_model(args.checkpoint, device, args.precision)
    meta = model.meta
    spec = args.data or meta.get("data")
    if not spec:
        raise UserError(f"{args.checkpoint} does not record its data; pass --data")
    splits = data_lib.load_data(
        spec,
        val_fraction=meta.get("val_fraction", 0.1),
        test_fraction=meta.get("test_fraction", 0.2),
        seed=meta.get("split_seed", 0),
        in_chans=_data_config(model).input_size[0],
        img_size=_data_config(model).img_size,
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
    loader = make_loader(
        data_lib.Transformed(dataset, _eval_transform(model)), args.batch_size, train=False
    )
    result = evaluate(model, loader, device=device, num_classes=model.num_classes)
    if not math.isfinite(result["loss"]):
        raise FloatingPointError(
            f"the loss of {args.checkpoint} on {args.split} is {result['loss']}: its outputs are "
            "not finite, so the checkpoint's weights are broken"
        )
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
        print(_json(row))
    else:
        print(
            f"{args.split}: {result['count']} images  loss {result['loss']:.4f}  "
            f"top-1 {result['acc1']:.4f}  top-5 {result['acc5']:.4f}"
        )
        print(f"confusion matrix: {confusion_path}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model = _checkpoint_model(args.checkpoint, device, args.precision)
    names = model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]
    rows = []
    for start in range(0, len(args.images), 64):
        paths = args.images[start : start + 64]
        batch = _model_inputs(model, paths).to(device)
        probs, indices = predict(model, batch, topk=args.topk)
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
        print(_json(rows))
        return 0
    for row in rows:
        best = row["predictions"][0]
        print(f"{row['image']}: {best['class']} ({best['probability']:.4f})")
        for pred in row["predictions"][1:]:
            print(f"    {pred['class']} ({pred['probability']:.4f})")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    model = _checkpoint_model(args.checkpoint, device)
    if not isinstance(model, VisionTransformer):
        raise UserError(
            f"{args.checkpoint} holds a timm CNN ({model.vitkit_timm['name']}), which has no "
            "attention to draw; explain takes a ViT checkpoint"
        )
    names = model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]
    target = _class_index(args.target, names) if args.target is not None else None
    batch = _model_inputs(model, [args.image]).to(device)
    original = data_lib.read_image(args.image, in_chans=batch.shape[1])  # at its own size
    maps = attention_maps(
        model, batch, head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, target=target
    )
    probs = torch.softmax(maps["logits"].float(), dim=-1)[0]
    k, explained = int(probs.argmax()), int(maps["target"][0])
    one = {key: value[0] for key, value in maps.items()}
    draw_explanation(
        original,
        one,
        args.out,
        per_head=args.per_head,
        target_name=names[explained],
        rollout_title=f"rollout ({args.head_fusion} of heads, discard {args.discard_ratio:g})",
        title=f"{Path(args.image).name}: predicted {names[k]} ({float(probs[k]):.3f})",
        readout=readout_of(model),
    )
    print(
        f"{args.image}: {names[k]} ({float(probs[k]):.4f}); explained class {names[explained]} "
        f"({float(probs[explained]):.4f}); attention maps in {args.out}"
    )
    return 0


def _class_index(text: str, names: Sequence[str]) -> int:
    """`--class`: a class name of the checkpoint, else an index."""
    if text in names:
        return list(names).index(text)
    if text.isdigit() and int(text) < len(names):
        return int(text)
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    raise UserError(
        f"--class {text!r} is not a class of this checkpoint; give a name ({shown}) or an "
        f"index 0 to {len(names) - 1}"
    )


def _fraction(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


# -- convert handlers -----------------------------------------------------------------------

PARITY_TOLERANCE = 1e-4


def _cmd_convert(args: argparse.Namespace) -> int:
    from . import convert
    from .weights import CheckpointError, load_pretrained, load_state_dict, save, weights_file
    from .weights.layout import NUM_HEADS_HINT

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
    except CheckpointError as err:  # convert's flag for the head count is --num-heads
        raise UserError(str(err).replace(NUM_HEADS_HINT, "--num-heads N")) from None
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
            weights = load_state_dict(weights_file(args.input))
        reference = convert.source_model(args.source, cfg, weights)
    except ImportError:
        print(f"parity check skipped: {library} is not installed")
        return 0
    height, width = model.patch_embed.img_size
    x = torch.randn(2, cfg.in_chans, height, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, ours = reference(x), model(x)
        if ours.shape != want.shape:  # a headless reference giving its tokens (HF's ViTModel)
            ours = model.forward_features(x)
        if ours.shape != want.shape:
            raise UserError(
                f"the parity check cannot compare vitkit's output {tuple(ours.shape)} with "
                f"{library}'s {tuple(want.shape)}; {args.output} is written: pass --no-parity"
            )
        diff = (ours - want).abs().max().item()
    verdict = "ok" if diff <= PARITY_TOLERANCE else "MISMATCH"
    print(
        f"parity vs {library}: max |difference| {diff:.2e} on a random batch of 2 "
        f"({verdict}, tolerance {PARITY_TOLERANCE:.0e})"
    )
    return 0 if verdict == "ok" else 1


# -- export handlers ------------------------------------------------------------------------


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_onnx, export_program

    if args.verify and args.format != "onnx":
        raise UserError(f"--verify checks ONNX files; drop it for --format {args.format}")
    model = load(args.checkpoint)
    if not isinstance(model, VisionTransformer):
        raise UserError(
            f"{args.checkpoint} holds a timm CNN ({model.vitkit_timm['name']}); vitkit exports "
            "ViTs: export the CNN with timm or torch.onnx.export"
        )
    if args.precision == "int8" and args.format != "onnx":
        raise UserError(
            f"--precision int8 exports ONNX only (onnxruntime's quantiser); a {args.format} "
            "export keeps float weights: quantise after loading (vitkit predict / eval "
            "--precision int8, or vitkit.model.precision.set_precision)"
        )
    if args.precision == "bf16":
        if args.format == "onnx":
            raise UserError(
                "--precision bf16 is not offered for ONNX (onnxruntime's CPU provider has no "
                "bf16 kernels for the model's products); export fp32, or --precision int8"
            )
        model.to(torch.bfloat16)
    if args.format in ("hf", "timm"):
        from .weights.folders import save_hf_folder, save_timm_folder

        save = save_hf_folder if args.format == "hf" else save_timm_folder
        save(model, args.output)
        loads = {
            "hf": "transformers' from_pretrained and AutoImageProcessor",
            "timm": f"timm.create_model('local-dir:{args.output}', pretrained=True)",
        }[args.format]
        print(f"wrote {args.output}/ ({args.format} folder, with its preprocessing; {loads})")
        return 0
    for name in ("onnx_ir", "onnxscript"):  # their INFO lines would drown ours
        logging.getLogger(name).setLevel(logging.WARNING)
    dynamic_batch = not args.static_batch
    dynamic_img_size = True if args.dynamic_img_size else None
    if args.format == "onnx":
        if args.verify:
            import onnxruntime  # noqa: F401  (missing: the one-line hint of `main`)
        export_onnx(
            model,
            args.output,
            dynamic_batch=dynamic_batch,
            dynamic_img_size=dynamic_img_size,
            opset=args.opset,
            verify=args.verify,
            precision=args.precision,
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
    from .summary import compare_params, flow

    model = _summary_model(args)
    size = (args.batch_size, model.config.in_chans, *model.patch_embed.img_size)
    if not (args.flow or args.compare_torch):
        print(summary(model, size, max_depth=args.max_depth))
        return 0
    native = flow(model, size)
    if args.flow:
        print(native.render(all_blocks=args.all_blocks))
    if args.compare_torch:
        twin = _summary_model(args, encoder="torch" if native.encoder == "native" else "native")
        other = flow(twin, size)
        if args.flow:
            print(other.render(all_blocks=args.all_blocks))
        pair = (native, other) if native.encoder == "native" else (other, native)
        print(compare_params(*pair))
    return 0


def _summary_model(args: argparse.Namespace, encoder: str | None = None) -> VisionTransformer:
    """The preset with the model options of the command line (`ViTConfig`'s flags)."""
    options = given_options(args, ViTConfig, generic="model-opt")
    if encoder is not None:
        options["encoder"] = encoder
    return registry.create_model(args.model, **options)


def _run_arguments(
    p: argparse.ArgumentParser, default_out: str, job: type[JobConfig]
) -> argparse._ArgumentGroup:
    """The flags of the job's config and the run-folder flags of `train` and `pretrain`."""
    notes = dict.fromkeys(RECIPE_OPTIONS, "recipes may change it")
    add_flags(p, job, notes=notes, choices={"recipe": tuple(RECIPES)})
    p.set_defaults(job=job)
    g = p.add_argument_group("this invocation")
    g.add_argument("--out", help=f"output folder (default: {default_out})")
    g.add_argument("--name", help="run name for the default output folder")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return g


def _precision_argument(p: argparse.ArgumentParser, export: bool = False) -> None:
    what = (
        "bf16 weights (folders, pt2) or an int8-quantised ONNX file (onnxruntime's dynamic "
        "quantiser)"
        if export
        else "bf16 where the CPU has native bf16 (else fp32, with a note), or int8 dynamic "
        "quantisation of every Linear (CPU)"
    )
    p.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help=f"{what} (default: fp32)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vitkit", description="Vision Transformers: train, evaluate, predict, explain."
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # -- train / eval / predict / explain parsers --

    p = sub.add_parser(
        "train",
        help="train a ViT (default: vit_digits on the built-in digits)",
        description="Train a ViT. Options left unset take the recipe's value (the data's own "
        "recipe, else a light one for tiny images and DeiT's otherwise); `config.json` records "
        "all.",
    )
    g = _run_arguments(p, "runs/<name>", TrainConfig)
    g.add_argument(
        "--config",
        metavar="JSON",
        help="settings from a file: a run's config.json or a flat object of the names of these "
        'options (e.g. {"epochs": 10}); options given here override it',
    )
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "pretrain",
        help="MAE self-supervised pretraining of a ViT on the training images (no labels)",
        description="Masked-autoencoder pretraining (He et al. 2022): the encoder sees 25%% of "
        "the patches, a light decoder rebuilds the rest. Takes the data, model, optimisation "
        "and run options of `vitkit train` and the MAE group; writes encoder.safetensors for "
        "`vitkit train --pretrained` and reconstructions.png every epoch.",
    )
    _run_arguments(p, "runs/mae-<data>", PretrainConfig)
    p.set_defaults(func=_cmd_pretrain)

    p = sub.add_parser("eval", help="loss, top-1/top-5 and a confusion matrix of a checkpoint")
    p.add_argument("--checkpoint", required=True, help="a model.safetensors written by train")
    p.add_argument("--data", help="data to evaluate (default: the data it was trained on)")
    p.add_argument("--split", choices=("test", "val", "train", "all"), default="test")
    p.add_argument(
        "--confusion",
        metavar="PNG",
        help="confusion matrix picture (default: beside the checkpoint)",
    )
    p.add_argument("--batch-size", type=_int_in(1), default=256)
    p.add_argument("--device")
    _precision_argument(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("predict", help="top classes and probabilities of images")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--topk", type=_int_in(1), default=5)
    p.add_argument("--device")
    _precision_argument(p)
    p.add_argument("--json", action="store_true", help="a JSON list instead of text")
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser(
        "explain",
        help="what the model looks at: class relevance, attention rollout and [CLS] attention "
        "over an image",
        description="Draws one PNG: the image and, blended over it at its own resolution with a "
        "colour bar, the class-specific relevance (gradient-weighted attention, Chefer et al. "
        "2021), the attention rollout and the last block's class-token attention.",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("image", metavar="IMAGE")
    p.add_argument("--out", required=True, metavar="PNG")
    p.add_argument("--per-head", action="store_true", help="also a grid of the last block's heads")
    p.add_argument(
        "--head-fusion",
        choices=("mean", "max", "min"),
        default="mean",
        help="how rollout combines heads",
    )
    p.add_argument(
        "--discard-ratio",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="rollout: zero this fraction of each fused map, lowest first, never the class "
        "token's own attention (default: 0)",
    )
    p.add_argument(
        "--class",
        dest="target",
        metavar="NAME|INDEX",
        help="the class to explain (default: the predicted one)",
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
    p.add_argument("--num-heads", type=_int_in(1), help="attention heads (default: inferred)")
    p.add_argument("--config", help="Hugging Face config.json (default: the one beside IN)")
    p.add_argument("--no-parity", action="store_true", help="skip the output comparison")
    p.set_defaults(func=_cmd_convert)

    # -- export parser --

    p = sub.add_parser(
        "export",
        help="export a checkpoint to ONNX, a torch.export program, or an HF / timm folder",
        description="Export a checkpoint saved by vitkit for serving without vitkit. Dynamic: "
        "the batch (unless --static-batch) and, for a model built with dynamic_img_size or with "
        "--dynamic-img-size, height and width as multiples of the patch size.",
    )
    p.add_argument(
        "output",
        help="the file to write (model.onnx, model.pt2) or, for --format hf / timm, the folder",
    )
    p.add_argument("--checkpoint", required=True, help="a checkpoint written by vitkit.save")
    p.add_argument(
        "--format",
        choices=("onnx", "pt2", "hf", "timm"),
        default="onnx",
        help="onnx, a torch.export program (pt2), or a folder that Hugging Face transformers "
        "(hf) or timm (timm) loads, with the model's preprocessing",
    )
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (18 or newer)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch size at 1")
    p.add_argument(
        "--dynamic-img-size",
        action="store_true",
        help="accept any multiple of the patch size (default: as the model was built)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="compare onnxruntime with PyTorch (within 1e-4; with int8, the float32 graph "
        "before quantising)",
    )
    _precision_argument(p, export=True)
    p.set_defaults(func=_cmd_export)

    # -- models / summary parsers --

    p = sub.add_parser("models", help="list the registered model names")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'vit_base*'")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser(
        "summary",
        help="per-layer shapes, parameters and FLOPs of a model, or its forward pass stage by "
        "stage (--flow)",
        description="The table lists every module; --flow walks the forward pass, one line per "
        "stage with its measured output shape. The model options are `ViTConfig`'s, as in "
        "`vitkit train`.",
    )
    p.add_argument("model", help="a registered model name (see `vitkit models`)")
    p.add_argument("--batch-size", type=_int_in(1), default=1)
    p.add_argument(
        "--max-depth", type=_int_in(0), default=2, help="deepest module level listed (default: 2)"
    )
    p.add_argument(
        "--flow",
        action="store_true",
        help="the forward pass stage by stage: operation, layout, measured shape, parameters",
    )
    p.add_argument(
        "--all-blocks",
        action="store_true",
        help="with --flow, every block (default: blocks that repeat block 0 on one line)",
    )
    p.add_argument(
        "--compare-torch",
        action="store_true",
        help="parameters per stage of the native encoder and the nn.TransformerEncoder one",
    )
    model_opt = "any model option by name, the value as JSON or text, e.g. depth=6 (repeatable)"
    add_flags(p, ViTConfig, show_defaults=False, generic=("model-opt", model_opt))
    p.set_defaults(func=_cmd_summary)
    return parser


# Optional packages -> the extra that installs them (pyproject.toml).
_EXTRAS = {
    "onnx": "onnx",
    "onnxscript": "onnx",
    "onnx_ir": "onnx",
    "onnxruntime": "onnx",
    "timm": "interop",
    "transformers": "interop",
    "torchvision": "interop",
}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe(err: BaseException) -> tuple[int, str]:
    """(exit code, message) of an error: 2 for a mistake in the command or its inputs, 1 for a
    run that failed."""
    if isinstance(err, ImportError):
        name = (err.name or "").split(".")[0]
        if name in _EXTRAS:
            return 2, (
                f"this needs the optional package {name}, which is not installed: "
                f"pip install 'vitkit[{_EXTRAS[name]}]'"
            )
        return 1, f"{_one_line(str(err))}; reinstall vitkit (pip install -e .)"
    if isinstance(err, (FloatingPointError, DiskFullError)):  # names the files kept
        return 1, _one_line(str(err))
    if isinstance(err, PermissionError):
        return 1, (
            f"permission denied: {err.filename}; check the permissions of that path or "
            "choose another location"
        )
    if isinstance(err, (UserError, ValueError, TypeError, OSError)):
        return 2, _one_line(str(err))
    if isinstance(err, MemoryError):
        return 1, "out of memory; use a smaller --batch-size or model"
    first = _one_line(str(err).strip().splitlines()[0]) if str(err).strip() else ""
    return 1, (
        f"unexpected {type(err).__name__}: {first[:300]}; rerun with --debug for the "
        "traceback and report it"
    )


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does (exit 130 with a message), in every phase;
    training installs its own handler, which saves the state first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 the run failed, 2 a mistake in the
    command or its inputs, 130 interrupted). Every error is one line `vitkit: error: ...`;
    `--debug` shows the traceback instead."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in arguments
    with _sigterm_interrupts():
        try:
            args = build_parser().parse_args(arguments)
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            return args.func(args)
        except KeyboardInterrupt as err:
            how = f" ({err.args[0]})" if err.args else ""
            print(f"vitkit: interrupted{how}", file=sys.stderr)
            return 130
        except Exception as err:
            if debug:
                raise
            code, message = _describe(err)
            print(f"vitkit: error: {message}", file=sys.stderr)
            return code
