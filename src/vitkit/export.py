"""Serve a ViT, a Swin or their backbones without vitkit: ONNX, `torch.export`, TorchScript.

Both exports go through `torch.export` (ONNX with PyTorch's torch.export-based exporter, which
needs `onnxscript`). What is dynamic in the exported graph:

- batch: dynamic (`dynamic_batch=True`, the default), or fixed at 1;
- height and width: dynamic with `dynamic_img_size` (default: the model's own setting), as
  multiples of the patch size (ONNX input dims `'16*grid_height'`, `'16*grid_width'`), or for
  a `dynamic_img_pad` model any size of two patches or more (`'height'`, `'width'`), padded in
  the graph. A learned
  position embedding is resampled inside the graph (ONNX `Resize`, cubic, antialias: opset 18
  or newer), a fixed table is recomputed; otherwise both are fixed at `img_size`;
- fixed: the channels, the dtype, and the outputs: logits (or pooled features when
  `num_classes=0`) for a model, the chosen blocks' maps for a `ViTBackbone`; attention maps
  are not exported.

A Swin exports at a fixed image size (dynamic batch as above): its window clamping, padding
and shift masks follow the input size, which `torch.export` does not trace in useful time
(over 10 minutes, unfinished, for a 2-block-per-stage Swin); export one file per size
(`model.set_input_size(img_size=...)` first), and `dynamic_img_size=True` is refused.

The ONNX graph does not validate its input the way `PatchEmbed.check_input` does: feed it
sizes that are multiples of the patch size (any size to a `dynamic_img_pad` model). The
TorchScript-based (legacy) ONNX exporter cannot export the antialiased bicubic resample;
`torch.jit.trace` works for the traced size, and `torch.jit.script` (the plain path).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from .files import atomic_write, check_output
from .model import ViTBackbone, architecture_of, build_model

log = logging.getLogger(__name__)

MIN_OPSET = 18  # Resize with antialias, needed by the position-embedding resample
PROTOBUF_LIMIT = 2**31 - 2**26  # an .onnx file holds < 2 GiB; keep a margin for the graph
DATA_CONFIG_PROP = "vitkit_data_config"  # metadata_props key: the model's data config (JSON)
CLASS_NAMES_PROP = "vitkit_class_names"  # metadata_props key: the class names (JSON list)
THRESHOLD_PROP = "vitkit_multi_label_threshold"  # a multi-label model's threshold (JSON number)
ONNX_PRECISIONS = ("fp32", "int8")

# A model of a vitkit family (`VisionTransformer`, `SwinTransformer`, ...) or its feature
# backbone (a `ViTBackbone`).
Exportable = nn.Module


def _vit(module: Exportable) -> nn.Module:
    return module.model if isinstance(module, ViTBackbone) else module


def exports_dynamic_img_size(module: Exportable, asked: bool | None) -> bool:
    """Whether an export of `module` takes other image sizes: `asked`, or (None) the model's
    own setting; a family whose exports have a fixed size (`Architecture.fixed_export_size`:
    the Swin, see above) refuses True."""
    fixed = architecture_of(_vit(module)).fixed_export_size
    if fixed is None:
        return _vit(module).patch_embed.dynamic_img_size if asked is None else asked
    if asked:
        raise ValueError(
            f"{fixed}; export one file per size after model.set_input_size(img_size=...), "
            "without dynamic_img_size"
        )
    return False


def example_input(
    module: Exportable, batch_size: int = 2, size: tuple[int, int] | None = None
) -> Tensor:
    """Random images at `size` (default: the model's `img_size`), on the model's device and
    in its dtype."""
    vit = _vit(module)
    param = next(vit.parameters())
    size = size or vit.patch_embed.img_size
    return torch.randn(
        batch_size, vit.config.in_chans, *size, device=param.device, dtype=param.dtype
    )


def _weight_bytes(module: Exportable) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _output_names(module: Exportable) -> list[str]:
    if isinstance(module, ViTBackbone):
        unit = architecture_of(module).feature_unit
        return [f"{unit}{i}" for i in module.out_indices]
    return ["logits" if module.num_classes else "features"]


def _with_dynamic_img_size(module: Exportable) -> Exportable:
    """A copy (same weights) that accepts any multiple of the patch size."""
    vit = _vit(module)
    if vit.patch_embed.dynamic_img_size:
        return module
    param = next(vit.parameters())
    with torch.random.fork_rng(devices=[]):  # the throwaway init must not move the user's RNG
        copy = build_model(vit.config.replace(dynamic_img_size=True))
    copy.load_state_dict(vit.state_dict())
    copy = copy.to(device=param.device, dtype=param.dtype).train(vit.training)
    if isinstance(module, ViTBackbone):
        return ViTBackbone(copy, module.out_indices, norm=module.norm).train(module.training)
    return copy


def _dynamic_shapes(
    vit: nn.Module, dynamic_batch: bool, dynamic_img_size: bool
) -> tuple[dict[int, object]]:
    dims: dict[int, object] = {}
    if dynamic_batch:
        dims[0] = Dim("batch")
    patch_h, patch_w = vit.patch_embed.patch_size
    if dynamic_img_size and vit.patch_embed.dynamic_img_pad:  # any size: the graph pads it
        # two patches or more each way, as the multiples below (export specialises a 1 grid)
        dims[2], dims[3] = Dim("height", min=2 * patch_h), Dim("width", min=2 * patch_w)
    elif dynamic_img_size:
        dims[2] = patch_h * Dim("grid_height")
        dims[3] = patch_w * Dim("grid_width")
    return (dims,)


def _sample(module: Exportable, dynamic_batch: bool, dynamic_img_size: bool) -> Tensor:
    """The tracing input; a dynamic dim must not be 1 (torch.export specialises 0 and 1)."""
    vit = _vit(module)
    size = vit.patch_embed.img_size
    if dynamic_img_size:
        (grid_h, grid_w), (patch_h, patch_w) = vit.patch_embed.grid_size, vit.patch_embed.patch_size
        size = (patch_h * max(grid_h, 2), patch_w * max(grid_w, 2))
    # float32 whatever the weights: a bf16 model's program casts its images (PatchEmbed)
    return example_input(module, batch_size=2 if dynamic_batch else 1, size=size).float()


@contextlib.contextmanager
def _eval_mode(module: Exportable) -> Iterator[Exportable]:
    """The module in eval mode (no dropout), its training flag restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@contextlib.contextmanager
def _prepared(
    module: Exportable, dynamic_batch: bool, dynamic_img_size: bool | None
) -> Iterator[tuple[Exportable, Tensor, tuple[dict[int, object]]]]:
    """The module to export (eval mode, a dynamic-size copy if asked), a sample input, and
    the dynamic shapes; restores the training flag afterwards."""
    dynamic_img_size = exports_dynamic_img_size(module, dynamic_img_size)
    if dynamic_img_size and _vit(module).config.conv_stem:
        raise ValueError(
            "a model with a conv_stem exports at its fixed img_size (the stem rounds odd sizes "
            "up, which export's size arithmetic does not follow); pass dynamic_img_size=False"
        )
    if dynamic_img_size:
        module = _with_dynamic_img_size(module)
    with _eval_mode(module):
        sample = _sample(module, dynamic_batch, dynamic_img_size)
        yield module, sample, _dynamic_shapes(_vit(module), dynamic_batch, dynamic_img_size)


def export_program(
    module: Exportable, *, dynamic_batch: bool = True, dynamic_img_size: bool | None = None
) -> ExportedProgram:
    """`torch.export.export` of a model or `ViTBackbone` in eval mode, with the dims above.

    `dynamic_img_size=None` follows the model; True on a fixed-size model exports a copy with
    the same weights that takes any multiple of the patch size.
    """
    with _prepared(module, dynamic_batch, dynamic_img_size) as (exported, sample, shapes):
        return torch.export.export(exported, (sample,), dynamic_shapes=shapes)


def export_onnx(
    module: Exportable,
    path: str | Path,
    *,
    dynamic_batch: bool = True,
    dynamic_img_size: bool | None = None,
    opset: int = MIN_OPSET,
    verify: bool = False,
    precision: str = "fp32",
    progress: Callable[[Iterable, int, str], Iterable] | None = None,
) -> Path:
    """Write a model or a `ViTBackbone` as an ONNX graph: one file, or for weights over
    2 GiB the graph plus the weights in `<path>.data` beside it (protobuf's limit).

    The input is 'image'; the output 'logits' (or 'features' for `num_classes=0`), or for a
    backbone one map per block, 'block2', 'block5', ... The model's metadata_props carry its
    data config (`vitkit_data_config`) and class names (`vitkit_class_names`), as JSON. The
    file is built in a private folder and written in place at the end (`files.atomic_write`:
    never over a special file).

    Args:
        module: the ViT or backbone; exported in eval mode (its training flag is restored).
        path: the .onnx file to write.
        dynamic_batch: a dynamic batch dimension, else batch 1.
        dynamic_img_size: dynamic height and width (multiples of the patch size); None follows
            the model's `dynamic_img_size`, True on a fixed-size model exports a copy with the
            same weights that takes other sizes.
        opset: the ONNX opset, 18 or newer.
        verify: run the file in onnxruntime and raise if it differs from PyTorch by more than
            1e-4 (needs `onnxruntime`); with int8, the float32 graph before quantising.
        precision: 'fp32', or 'int8': the float32 graph quantised by onnxruntime's dynamic
            quantiser (`quantize_onnx`).
        progress: `progress(steps, total, description)` -> the steps (the graph, the check,
            the quantising), e.g. wrapped in a progress bar (the command line's).
    """
    _check_onnx_options(opset, precision)
    dynamic_img_size = exports_dynamic_img_size(module, dynamic_img_size)
    path = Path(path)
    with _staging(path) as folder:
        staged = folder / path.name
        graph = staged if precision == "fp32" else folder / "fp32.onnx"
        steps = [lambda: _write_graph(module, graph, dynamic_batch, dynamic_img_size, opset)]
        if verify:
            steps.append(
                lambda: check_onnx(
                    module, graph, dynamic_batch=dynamic_batch, dynamic_img_size=dynamic_img_size
                )
            )
        if graph != staged:
            steps.append(lambda: quantize_onnx(graph, staged))
        for step in progress(steps, len(steps), "export") if progress else steps:
            step()
        _set_metadata(staged, onnx_metadata(module))
        for name in (path.name, f"{path.name}.data"):  # the graph, and external weights if any
            if (folder / name).is_file():
                atomic_write(path.with_name(name), _copy_from(folder / name))
    log.debug(
        "wrote %s (opset %d, %s, dynamic batch: %s, dynamic image size: %s)",
        path,
        opset,
        precision,
        dynamic_batch,
        dynamic_img_size,
    )
    return path


def _check_onnx_options(opset: int, precision: str) -> None:
    """Refuse a precision or opset the export cannot give, before any work."""
    if precision not in ONNX_PRECISIONS:
        raise ValueError(
            f"ONNX precision {precision!r} is not supported; choose one of "
            f"{', '.join(ONNX_PRECISIONS)} (onnxruntime's CPU provider has no bf16 kernels for "
            "the model's products)"
        )
    if opset < MIN_OPSET:
        raise ValueError(
            f"opset {opset} is too old: the position-embedding resample needs ONNX Resize with "
            f"antialias, opset {MIN_OPSET} or newer; pass opset={MIN_OPSET}"
        )
    import onnx.defs  # the ONNX extra (missing: one line naming it)

    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ValueError(
            f"opset {opset} is newer than the installed onnx knows ({newest}); pass an opset "
            f"from {MIN_OPSET} to {newest}"
        )


@contextlib.contextmanager
def _staging(path: Path) -> Iterator[Path]:
    """A private folder to build the files in: beside the target when that is a file or new
    (the same file system), else (a character device such as /dev/null) the system's
    temporary folder; a target that is a FIFO, socket or folder is refused first."""
    if check_output(path) == "character device":
        where = None
    else:
        where = Path(os.path.realpath(path)).parent
        where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".vitkit-export-") as folder:
        yield Path(folder)


def _write_graph(
    module: Exportable, graph: Path, dynamic_batch: bool, dynamic_img_size: bool, opset: int
) -> None:
    """The float32 ONNX graph (and `<graph>.data` for weights over protobuf's limit)."""
    with _prepared(module, dynamic_batch, dynamic_img_size) as (exported, sample, shapes):
        # Passing the module (not an ExportedProgram) keeps the dim names in the ONNX file.
        torch.onnx.export(
            exported,
            (sample,),
            str(graph),
            dynamo=True,
            dynamic_shapes=shapes,
            opset_version=opset,
            input_names=["image"],
            output_names=_output_names(module),
            external_data=_weight_bytes(exported) >= PROTOBUF_LIMIT,
            verbose=False,
        )


def onnx_metadata(module: Exportable) -> dict[str, str]:
    """The metadata_props an exported file carries: the model's data config and class names
    (JSON), where it has them, and a multi-label model's threshold."""
    vit = _vit(module)
    props = {}
    data_config = getattr(vit, "data_config", None)
    if data_config is not None:  # the preprocessing travels with the file
        props[DATA_CONFIG_PROP] = json.dumps(data_config.to_dict())
    names = getattr(vit, "meta", {}).get("class_names")
    if names and not isinstance(module, ViTBackbone) and len(names) == vit.num_classes:
        props[CLASS_NAMES_PROP] = json.dumps(list(names))
    meta = getattr(vit, "meta", {})
    if meta.get("multi_label") and not isinstance(module, ViTBackbone):
        props[THRESHOLD_PROP] = json.dumps(float(meta.get("threshold", 0.5)))
    return props


def read_onnx_threshold(proto: Any) -> float | None:
    """A multi-label model's threshold, as `export_onnx` wrote it; None for a single-label
    one."""
    value = {p.key: p.value for p in proto.metadata_props}.get(THRESHOLD_PROP)
    return None if value is None else float(json.loads(value))


def read_onnx_metadata(proto: Any) -> tuple[dict[str, Any] | None, list[str] | None]:
    """(data config, class names) of a loaded ONNX model (`onnx.ModelProto`) as
    `export_onnx` wrote them, None where the file records none."""
    props = {p.key: p.value for p in proto.metadata_props}
    data_config = props.get(DATA_CONFIG_PROP)
    names = props.get(CLASS_NAMES_PROP)
    return (
        json.loads(data_config) if data_config is not None else None,
        json.loads(names) if names is not None else None,
    )


def _set_metadata(path: Path, props: dict[str, str]) -> None:
    import onnx

    if not props:
        return
    proto = onnx.load(str(path), load_external_data=False)
    onnx.helper.set_model_props(proto, props)
    onnx.save(proto, str(path))


def _copy_from(source: Path) -> Callable[[Any], None]:
    def copy(f: Any) -> None:
        with source.open("rb") as data:
            shutil.copyfileobj(data, f, 1 << 24)

    return copy


def save_program(program: ExportedProgram, path: str | Path) -> Path:
    """`torch.export.save` through `files.atomic_write` (whole or absent; never over a
    special file)."""
    atomic_write(path, lambda f: torch.export.save(program, f))
    return Path(path)


def quantize_onnx(source: str | Path, target: str | Path) -> Path:
    """onnxruntime's dynamic int8 quantisation of a float32 ONNX file: the weights of every
    MatMul / Gemm in int8 per output channel, activations quantised per batch at run time, as
    `torch.ao`'s dynamic quantisation does (needs `onnxruntime`)."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as err:
        raise ImportError(
            "int8 ONNX export needs onnxruntime: pip install 'vitkit[onnx]'", name="onnxruntime"
        ) from err
    import onnx

    # The exporter's recorded intermediate shapes can trip the quantiser's own shape inference
    # (seen with torch 2.11 / onnxruntime 1.30: "Inferred shape and existing shape differ");
    # it infers them again from the graph.
    proto = onnx.load(str(source))
    del proto.graph.value_info[:]
    onnx.save(proto, str(source))
    quantize_dynamic(str(source), str(target), per_channel=True, weight_type=QuantType.QInt8)
    return Path(target)


def check_onnx(
    module: Exportable,
    path: str | Path,
    *,
    dynamic_batch: bool = True,
    dynamic_img_size: bool = False,
    atol: float = 1e-4,
) -> float:
    """Run the ONNX file in onnxruntime on random float32 images and compare with PyTorch.

    Uses the model's size and, with `dynamic_img_size`, a second one (two more patches each
    way) and for a `dynamic_img_pad` model a third that is not a multiple of the patch size;
    three images with `dynamic_batch`. Returns the largest absolute difference, and logs the
    comparison in one line; raises ValueError above `atol`.
    """
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError(
            "check_onnx needs onnxruntime: pip install 'vitkit[onnx]'", name="onnxruntime"
        ) from err
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    vit = _vit(module)
    sizes = [vit.patch_embed.img_size]
    if dynamic_img_size:
        (patch_h, patch_w), (height, width) = vit.patch_embed.patch_size, sizes[0]
        sizes.append((height + 2 * patch_h, width + 2 * patch_w))
        if vit.patch_embed.dynamic_img_pad:  # and a size the graph must pad
            sizes.append((height + patch_h + 1, width + 2 * patch_w - 1))
    reference = _with_dynamic_img_size(module) if dynamic_img_size else module
    worst = 0.0
    with _eval_mode(reference):
        for height, width in sizes:
            x = torch.randn(3 if dynamic_batch else 1, vit.config.in_chans, height, width)
            with torch.no_grad():
                expected = reference(x.to(next(reference.parameters())))
            expected = expected if isinstance(expected, list) else [expected]
            got = session.run(None, {"image": x.numpy()})
            for name, want, have in zip(_output_names(module), expected, got):
                diff = (torch.from_numpy(have) - want.float().cpu()).abs().max().item()
                if diff > atol:
                    raise ValueError(
                        f"{path}: onnxruntime differs from PyTorch by {diff:.2e} (> {atol:g}) "
                        f"in output {name!r} at input size {height}x{width}; export in "
                        "float32, or report the model config"
                    )
                worst = max(worst, diff)
    batch = 3 if dynamic_batch else 1
    count = batch * len(sizes)
    log.info(
        "verified: onnxruntime's outputs equal PyTorch's within %s (max difference %.1e) on %d "
        "random %s (%s)",
        f"{atol:.0e}".replace("e-0", "e-"),  # 1e-4, as written in the docs
        worst,
        count,
        "image" if count == 1 else "images",
        ", ".join(f"{batch} at {h}x{w}" for h, w in sizes),
    )
    return worst
