"""Load a model to run it: weights in, a `Predictor` out. `load_for_inference` reads any weights
`weights.load_any` reads, once, on a device and at a precision, with the preparation overridden
as asked, refusing weights without a classifier head where class scores are needed; the
predictor prepares images as the weights' data config says, predicts the top classes and
explains (the method `explain.explanation_method` decides). `vitkit eval`, `predict`, `explain`
and `serve` all run their model through it, as timm's `inference.py` runs `create_model`,
`resolve_data_config` and `create_transform`.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from typing import IO, Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from .data import eval_transform
from .data.data_config import DataConfig
from .explain import MAPS, Explanation, explain_image, explanation_method
from .model.precision import model_device, set_precision
from .weights import WeightsInfo, inspect, load_any
from .weights.hub_cache import source_name as source_name  # for serve, which reads no weights

log = logging.getLogger(__name__)


@torch.inference_mode()
def predict(
    model: nn.Module, images: Tensor, topk: int = 5, multi_label: bool = False
) -> tuple[Tensor, Tensor]:
    """Top-k class probabilities and indices, most probable first, for a batch (B, C, H, W) of
    normalised images (`multi_label`: each class's sigmoid); a FloatingPointError names the
    images whose outputs are not finite."""
    model.eval()
    return top_classes(model(images).float(), topk, multi_label)


def top_classes(logits: Tensor, topk: int, multi_label: bool = False) -> tuple[Tensor, Tensor]:
    """The top-k probabilities and indices of a batch of logits (B, classes), most probable
    first (a multi-label model's: each class's sigmoid, not a softmax over them); a
    FloatingPointError names the images whose logits are not finite."""
    bad = (~torch.isfinite(logits).all(dim=-1)).nonzero().flatten().tolist()
    if bad:
        raise FloatingPointError(
            f"the model's outputs are not finite (NaN or inf) for image(s) {bad[:10]} of the "
            "batch; the checkpoint's weights or the images are broken"
        )
    probs = torch.sigmoid(logits) if multi_label else F.softmax(logits, dim=-1)
    k = min(topk, probs.shape[-1])
    values, indices = probs.topk(k, dim=-1)  # (B, k)
    return values, indices


def over_threshold(probs: Tensor, threshold: float) -> list[list[tuple[float, int]]]:
    """Each image's (probability, class index) pairs at or over `threshold`, most probable
    first: a multi-label model's labels, from its (B, classes) sigmoid probabilities."""
    found = []
    for row in probs.tolist():
        kept = [(q, i) for i, q in enumerate(row) if q >= threshold]
        found.append(sorted(kept, key=lambda pair: -pair[0]))
    return found


def labels_of(
    predictor: Any, images: Tensor, threshold: float | None = None
) -> list[list[tuple[float, int]]]:
    """A multi-label predictor's labels of prepared images: its every class's probability,
    those at or over `threshold` (default: the predictor's), most probable first."""
    probs, indices = predictor.predict(images, len(predictor.class_names))
    ordered = torch.zeros_like(probs).scatter_(1, indices, probs)  # (B, classes)
    return over_threshold(ordered, predictor.threshold if threshold is None else threshold)


def class_names(model: nn.Module) -> list[str]:
    """The names the model's weights give its classes, else the class indices."""
    names = getattr(model, "meta", {}).get("class_names")
    return list(names) if names else [str(i) for i in range(model.num_classes)]


def with_overrides(data_config: DataConfig, overrides: Mapping[str, Any]) -> DataConfig:
    """`data_config` with some of its options replaced; a crop fraction given alone crops the
    centre (a squash of the weights' config would otherwise ignore it)."""
    changes = dict(overrides)
    if "crop_pct" in changes:
        changes.setdefault("crop_mode", "center")
    try:
        return data_config.replace(**changes)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the image preparation flags: {err}") from None


class Predictor:
    """A classifier ready to run: its images prepared as its weights' data config says, its
    top classes, its explanations.

    Args:
        model: a classifier with a `data_config` (as `weights.load_any` gives), in fp32.
        precision: 'fp32', 'bf16' or 'int8' (`model.precision.set_precision`).
        name: what messages name the model by (e.g. its weights' path).
        what: what the model is, for refusals (e.g. 'a timm CNN (resnet18)').
        explanations: keep what explanations need at this precision: an int8 model has no
            gradients, so an fp32 copy is kept to explain with.
    """

    platform = "pytorch_libtorch"  # what runs the model, in the Open Inference Protocol's words

    def __init__(
        self,
        model: nn.Module,
        *,
        precision: str = "fp32",
        name: str = "the model",
        what: str | None = None,
        explanations: bool = False,
    ) -> None:
        if getattr(model, "data_config", None) is None:
            raise ValueError(
                "the model has no data config; load it with vitkit.load or vitkit.load_pretrained "
                "(or set model.data_config) so that images are prepared as for its weights"
            )
        self.name = name
        self.what = what or f"a {type(model).__name__}"
        self.data_config: DataConfig = model.data_config
        self.class_names = class_names(model)
        meta = getattr(model, "meta", {})
        # a multi-label model's labels are the classes whose sigmoid reaches its threshold
        self.multi_label = bool(meta.get("multi_label", False))
        self.threshold = float(meta.get("threshold", 0.5))
        self.explanation = explanation_method(model)
        keep = explanations and self.explanation is not None and precision == "int8"
        fp32_copy = copy.deepcopy(model).eval() if keep else None
        self.precision = set_precision(model, precision)
        self.model = model
        # what explanations run on: the model, or the fp32 copy of an int8 one (None: none)
        gradients = self.explanation is not None and self.precision != "int8"
        self.explainer: nn.Module | None = fp32_copy or (model if gradients else None)
        self.device = model_device(model)
        self._prepare = eval_transform(self.data_config)

    @property
    def in_chans(self) -> int:
        return self.data_config.input_size[0]

    @property
    def maps(self) -> tuple[str, ...]:
        """The maps the model's explanation gives (none for a model without one)."""
        return MAPS.get(self.explanation, ())

    def prepare(self, image: Image.Image) -> Tensor:
        """A decoded image -> the normalised (C, H, W) tensor the model takes."""
        return self._prepare(image)

    def predict(self, images: Tensor, topk: int = 5) -> tuple[Tensor, Tensor]:
        """Each prepared image's (B, C, H, W) `topk` most probable classes, most probable
        first: (probabilities, class indices), each (B, k); a multi-label model's
        probabilities are each class's sigmoid."""
        return predict(self.model, images.to(self.device), topk, self.multi_label)

    def labels(
        self, images: Tensor, threshold: float | None = None
    ) -> list[list[tuple[float, int]]]:
        """A multi-label model's labels of each prepared image (B, C, H, W): the (sigmoid
        probability, class index) pairs at or over `threshold` (default: the checkpoint's),
        most probable first."""
        return labels_of(self, images, threshold)

    def explain(
        self,
        image: str | os.PathLike | IO[bytes],
        *,
        target: int | None = None,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        per_head: bool = False,
        out: str | os.PathLike | None = None,
    ) -> Explanation:
        """The maps of one image file (`explain.explain_image`, with the class names), and with
        `out` their picture; refused for a model without an explanation."""
        if self.explanation is None:
            raise ValueError(
                f"{self.name} holds {self.what}, which has no attention to draw; explain takes a "
                "ViT or Swin checkpoint"
            )
        if self.explainer is None:
            raise ValueError(
                f"{self.name} runs in int8, which has no gradients to explain with; load it with "
                "explanations=True (an fp32 copy is kept) or in fp32"
            )
        return explain_image(
            self.explainer,
            image,
            self.data_config,
            target=target,
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
            per_head=per_head,
            class_names=self.class_names,
            out=out,
        )


def load_for_inference(
    weights: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    arch: str | None = None,
    num_heads: int | None = None,
    data_overrides: Mapping[str, Any] | None = None,
    classifier: bool = True,
    purpose: str = "inference",
    explanations: bool = False,
) -> Predictor:
    """The predictor of `weights` (read once: `weights.inspect`, then `weights.load_any`).

    Args:
        weights: a vitkit checkpoint, or timm / Hugging Face / torchvision / JAX weights, a
            file or a model folder.
        device: where the model runs.
        precision: 'fp32', 'bf16' or 'int8'.
        arch, num_heads: what the weights do not record (`weights.load_any`'s).
        data_overrides: `DataConfig` options over the weights' own (`with_overrides`).
        classifier: refuse weights without a classifier head (class scores are needed).
        purpose: what needs the class scores, for that refusal (e.g. 'eval').
        explanations: keep what explanations need at this precision (`Predictor`).
    """
    info = inspect(weights, num_heads=num_heads, arch=arch)
    if classifier and info.num_classes == 0:
        raise ValueError(
            f"{weights} is {info.kind} without a classifier head; {purpose} needs class scores: "
            f"fine-tune it first (vitkit train --pretrained {weights})"
        )
    model = load_any(info, num_heads=num_heads, arch=arch, map_location=device)
    model.data_config = with_overrides(model.data_config, data_overrides or {})
    if classifier and not model.meta.get("class_names"):
        log.warning("%s names no classes; they are named by their indices", weights)
    return Predictor(
        model, precision=precision, name=str(weights), what=_what(info), explanations=explanations
    )


def _what(info: WeightsInfo) -> str:
    """What weights hold, for refusals: 'a timm CNN (resnet18)', else what they are."""
    return f"a timm CNN ({info.cnn['name']})" if info.cnn else info.kind


class OnnxPredictor:
    """A classifier exported by `vitkit export` (`export.export_onnx`) run by onnxruntime,
    behind `Predictor`'s interface: images prepared as the data config in the file's metadata
    says, its top classes named by the file's class names. An ONNX graph has no gradients:
    it does not explain.

    Args:
        path: the .onnx file (its weights beside it as `<path>.data` when over 2 GiB).
        threads: onnxruntime's threads (default: torch's, as the process set them).
        data_overrides: `DataConfig` options over the file's own (`with_overrides`).
    """

    platform = "onnxruntime_onnx"
    explanation = None
    explainer = None
    maps: tuple[str, ...] = ()
    device = torch.device("cpu")

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        threads: int | None = None,
        data_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        proto, self.session = _onnx_session(path, threads or torch.get_num_threads())
        from .export import read_onnx_metadata, read_onnx_threshold

        config, names = read_onnx_metadata(proto)
        threshold = read_onnx_threshold(proto)
        self.multi_label = threshold is not None
        self.threshold = 0.5 if threshold is None else threshold
        if config is None:
            raise ValueError(
                f"{path} records no data config (metadata vitkit_data_config); export the "
                "checkpoint with vitkit export, which writes it"
            )
        self.name = str(path)
        self.what = "an ONNX graph"
        self.data_config = with_overrides(DataConfig.from_dict(config), data_overrides or {})
        output = self.session.get_outputs()[0]
        if output.name != "logits":
            raise ValueError(
                f"{path} gives {output.name!r}, not class scores ('logits'); serve an ONNX file "
                "of a model with a classifier head"
            )
        classes = output.shape[-1]
        self.class_names = list(names) if names else [str(i) for i in range(classes)]
        self.precision = "int8" if _quantised(proto) else "fp32"
        self._input = self.session.get_inputs()[0]
        self._fixed_batch = self._input.shape[0] == 1  # exported with dynamic_batch=False
        self._prepare = eval_transform(self.data_config)

    @property
    def in_chans(self) -> int:
        return self.data_config.input_size[0]

    def prepare(self, image: Image.Image) -> Tensor:
        """A decoded image -> the normalised (C, H, W) tensor the graph takes."""
        return self._prepare(image)

    def predict(self, images: Tensor, topk: int = 5) -> tuple[Tensor, Tensor]:
        """As `Predictor.predict`: (probabilities, class indices), each (B, k)."""
        batch = images.float().numpy()
        chunks = [batch[i : i + 1] for i in range(len(batch))] if self._fixed_batch else [batch]
        logits = [self.session.run(None, {self._input.name: chunk})[0] for chunk in chunks]
        logits = torch.from_numpy(np.concatenate(logits)).float()
        return top_classes(logits, topk, self.multi_label)

    def labels(
        self, images: Tensor, threshold: float | None = None
    ) -> list[list[tuple[float, int]]]:
        """As `Predictor.labels`: a multi-label graph's labels over the threshold."""
        return labels_of(self, images, threshold)

    def explain(self, image: Any, **kwargs: Any) -> Explanation:
        raise ValueError(
            f"{self.name} is an ONNX graph, which has no gradients to explain with; serve the "
            "checkpoint it was exported from to explain"
        )


def _onnx_session(path: str | os.PathLike, threads: int) -> tuple[Any, Any]:
    """The ONNX model (without its external weights) and an onnxruntime CPU session of it."""
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise ImportError(
            f"serving an ONNX file needs onnx and onnxruntime: pip install 'vitkit[onnx]' ({err})",
            name=err.name,
        ) from err
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such ONNX file")
    proto = onnx.load(str(path), load_external_data=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return proto, session


def _quantised(proto: Any) -> bool:
    """Whether an ONNX graph runs int8 products (onnxruntime's dynamic quantiser's nodes)."""
    ops = {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul"}
    return any(node.op_type in ops for node in proto.graph.node)
