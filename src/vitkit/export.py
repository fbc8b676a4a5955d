"""Serve a ViT without Python-side vitkit code: ONNX, `torch.export`, TorchScript.

Both exports go through `torch.export` (ONNX with PyTorch's torch.export-based exporter, which
needs `onnxscript`). What is dynamic in the exported graph:

- batch: dynamic (`dynamic_batch=True`, the default), or fixed at 1;
- height and width: dynamic with `dynamic_img_size` (default: the model's own setting), as
  multiples of the patch size (ONNX input dims `'16*grid_height'`, `'16*grid_width'`). A learned
  position embedding is resampled inside the graph (ONNX `Resize`, cubic, antialias: opset 18
  or newer), a fixed table is recomputed; otherwise both are fixed at `img_size`;
- fixed: the channels, the dtype, and the output (logits, or pooled features when
  `num_classes=0`; attention maps and intermediate features are not exported).

The ONNX graph does not validate its input the way `PatchEmbed.check_input` does: feed it
sizes that are multiples of the patch size. The TorchScript-based (legacy) ONNX exporter cannot
export the antialiased bicubic resample, and `torch.jit.script` cannot compile the model (its
input checks build error messages from shapes); `torch.jit.trace` works, for the traced size.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor
from torch.export import Dim, ExportedProgram

from .model import VisionTransformer

log = logging.getLogger(__name__)

MIN_OPSET = 18  # Resize with antialias, needed by the position-embedding resample


def example_input(model: VisionTransformer, batch_size: int = 2) -> Tensor:
    """Random images at the model's `img_size`, on its device and in its dtype."""
    param = next(model.parameters())
    size = model.patch_embed.img_size
    return torch.randn(
        batch_size, model.config.in_chans, *size, device=param.device, dtype=param.dtype
    )


def _with_dynamic_img_size(model: VisionTransformer) -> VisionTransformer:
    """A copy of `model` (same weights) that accepts any multiple of the patch size."""
    if model.patch_embed.dynamic_img_size:
        return model
    param = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # the throwaway init must not move the user's RNG
        copy = VisionTransformer(model.config.replace(dynamic_img_size=True))
    copy.load_state_dict(model.state_dict())
    return copy.to(device=param.device, dtype=param.dtype)


def _dynamic_shapes(
    model: VisionTransformer, dynamic_batch: bool, dynamic_img_size: bool
) -> tuple[dict[int, object]]:
    dims: dict[int, object] = {}
    if dynamic_batch:
        dims[0] = Dim("batch")
    if dynamic_img_size:
        patch_h, patch_w = model.patch_embed.patch_size
        dims[2] = patch_h * Dim("grid_height")
        dims[3] = patch_w * Dim("grid_width")
    return (dims,)


def _sample(model: VisionTransformer, dynamic_batch: bool, dynamic_img_size: bool) -> Tensor:
    """The tracing input; a dynamic dim must not be 1 (torch.export specialises 0 and 1)."""
    x = example_input(model, batch_size=2 if dynamic_batch else 1)
    if dynamic_img_size:
        grid, patch = model.patch_embed.grid_size, model.patch_embed.patch_size
        height = patch[0] * max(grid[0], 2)
        width = patch[1] * max(grid[1], 2)
        x = x.new_zeros(x.shape[0], x.shape[1], height, width).normal_()
    return x


@contextlib.contextmanager
def _prepared(
    model: VisionTransformer, dynamic_batch: bool, dynamic_img_size: bool | None
) -> Iterator[tuple[VisionTransformer, Tensor, tuple[dict[int, object]]]]:
    """The model to export (eval mode, a dynamic-size copy if asked), a sample input, and
    the dynamic shapes; restores the training flag afterwards."""
    if dynamic_img_size is None:
        dynamic_img_size = model.patch_embed.dynamic_img_size
    if dynamic_img_size:
        model = _with_dynamic_img_size(model)
    was_training = model.training
    model.eval()
    try:
        sample = _sample(model, dynamic_batch, dynamic_img_size)
        yield model, sample, _dynamic_shapes(model, dynamic_batch, dynamic_img_size)
    finally:
        model.train(was_training)


def export_program(
    model: VisionTransformer, *, dynamic_batch: bool = True, dynamic_img_size: bool | None = None
) -> ExportedProgram:
    """`torch.export.export` of the model in eval mode, with the dims described above.

    `dynamic_img_size=None` follows the model; True on a fixed-size model exports a copy with
    the same weights that takes any multiple of the patch size.
    """
    with _prepared(model, dynamic_batch, dynamic_img_size) as (model, sample, shapes):
        return torch.export.export(model, (sample,), dynamic_shapes=shapes)


def export_onnx(
    model: VisionTransformer,
    path: str | Path,
    *,
    dynamic_batch: bool = True,
    dynamic_img_size: bool | None = None,
    opset: int = MIN_OPSET,
    verify: bool = False,
) -> Path:
    """Write the model as an ONNX graph (input 'image', output 'logits' or 'features').

    Args:
        model: the ViT; exported in eval mode (its training flag is restored).
        path: the .onnx file to write.
        dynamic_batch: a dynamic batch dimension, else batch 1.
        dynamic_img_size: dynamic height and width (multiples of the patch size); None follows
            the model's `dynamic_img_size`, True on a fixed-size model exports a copy with the
            same weights that takes other sizes.
        opset: the ONNX opset, 18 or newer.
        verify: run the file in onnxruntime and raise if it differs from PyTorch by more than
            1e-4 (needs `onnxruntime`).
    """
    if opset < MIN_OPSET:
        raise ValueError(
            f"opset {opset} is too old: the position-embedding resample needs ONNX Resize with "
            f"antialias, opset {MIN_OPSET} or newer; pass opset={MIN_OPSET}"
        )
    if dynamic_img_size is None:
        dynamic_img_size = model.patch_embed.dynamic_img_size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    output = "logits" if model.num_classes else "features"
    with _prepared(model, dynamic_batch, dynamic_img_size) as (exported, sample, shapes):
        # Passing the module (not an ExportedProgram) keeps the dim names in the ONNX file.
        torch.onnx.export(
            exported,
            (sample,),
            str(path),
            dynamo=True,
            dynamic_shapes=shapes,
            opset_version=opset,
            input_names=["image"],
            output_names=[output],
            verbose=False,
        )
    log.debug(
        "wrote %s (opset %d, dynamic batch: %s, dynamic image size: %s)",
        path,
        opset,
        dynamic_batch,
        dynamic_img_size,
    )
    if verify:
        check_onnx(model, path, dynamic_batch=dynamic_batch, dynamic_img_size=dynamic_img_size)
    return path


def check_onnx(
    model: VisionTransformer,
    path: str | Path,
    *,
    dynamic_batch: bool = True,
    dynamic_img_size: bool = False,
    atol: float = 1e-4,
) -> float:
    """Run the ONNX file in onnxruntime on random float32 images and compare with PyTorch.

    Uses the model's size and, with `dynamic_img_size`, a second one (two more patches each
    way); three images with `dynamic_batch`. Returns the largest absolute difference; raises
    ValueError above `atol`.
    """
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError("check_onnx needs onnxruntime: pip install onnxruntime") from err
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = _with_dynamic_img_size(model) if dynamic_img_size else model
    was_training = reference.training
    reference.eval()
    sizes = [model.patch_embed.img_size]
    if dynamic_img_size:
        (patch_h, patch_w), (height, width) = model.patch_embed.patch_size, sizes[0]
        sizes.append((height + 2 * patch_h, width + 2 * patch_w))
    worst = 0.0
    try:
        for height, width in sizes:
            x = torch.randn(3 if dynamic_batch else 1, model.config.in_chans, height, width)
            with torch.no_grad():
                expected = reference(x.to(next(reference.parameters()))).float().cpu()
            (got,) = session.run(None, {"image": x.numpy()})
            diff = (torch.from_numpy(got) - expected).abs().max().item()
            if diff > atol:
                raise ValueError(
                    f"{path}: onnxruntime differs from PyTorch by {diff:.2e} (> {atol:g}) at "
                    f"input size {height}x{width}; export in float32, or report the model config"
                )
            worst = max(worst, diff)
    finally:
        reference.train(was_training)
    return worst
