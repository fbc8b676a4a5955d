"""Distillation teachers from any framework: a ViT in any format `load_pretrained` reads, a
timm or torchvision model (a CNN such as a ResNet, as DeiT distils from RegNet), or an ONNX
file run by onnxruntime.

DeiT (Touvron et al. 2021, Section 5) feeds the teacher the student's augmented batch. The
teacher was trained on its own preparation, so `Teacher` turns the student's normalised batch
back into pixels, resizes it to the teacher's input size and normalises it with the teacher's
mean and std (its data config) before running it, in eval mode and without gradients.

`--teacher` takes a path (`.onnx`, or weights) or `timm:NAME` / `torchvision:NAME`, with
`--teacher-weights FILE` for the latter two (read without unpickling code).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from ..weights import WeightsInfo, inspect, load_any, load_state_dict
from ..weights.checkpoint import OPTION_FORMS, MissingOptionError, load_into

log = logging.getLogger(__name__)

LIBRARIES = ("timm", "torchvision")


class Teacher(nn.Module):
    """A frozen classifier fed the student's batch in its own preparation.

    Args:
        model: the classifier, (B, C, H, W) -> (B, num_classes) logits.
        num_classes: its outputs.
        data_config: its input size, mean, std and interpolation.
        student_mean, student_std: how the student's batch is normalised.
        name: for messages.
    """

    def __init__(
        self,
        model: Callable[[Tensor], Tensor],
        *,
        num_classes: int,
        data_config: DataConfig,
        student_mean: Sequence[float],
        student_std: Sequence[float],
        name: str,
    ) -> None:
        super().__init__()
        self.model = model
        self.num_classes = num_classes
        self.data_config = data_config
        self.name = name
        chans = data_config.input_size[0]
        if len(student_mean) not in (1, chans):
            raise ValueError(
                f"the teacher {name} takes {chans}-channel images, the student "
                f"{len(student_mean)}; distil between models of the same channels"
            )
        self.register_buffer("student_mean", torch.tensor(student_mean).view(1, -1, 1, 1))
        self.register_buffer("student_std", torch.tensor(student_std).view(1, -1, 1, 1))
        self.register_buffer("mean", torch.tensor(data_config.mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(data_config.std).view(1, -1, 1, 1))
        if isinstance(model, nn.Module):
            model.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> Teacher:
        """Always eval mode: a teacher's dropout and norms stay fixed."""
        return super().train(False)

    def prepare(self, images: Tensor) -> Tensor:
        """The student's normalised batch as the teacher's input: pixels, resized, with the
        teacher's normalisation; grey images repeated to three channels when it takes RGB."""
        pixels = images.float() * self.student_std + self.student_mean  # (B, C, H, W) in [0, 1]
        chans = self.data_config.input_size[0]
        if pixels.shape[1] == 1 and chans == 3:
            pixels = pixels.expand(-1, 3, -1, -1)
        size = self.data_config.img_size
        if tuple(pixels.shape[-2:]) != size:
            mode = "bicubic" if self.data_config.interpolation == "bicubic" else "bilinear"
            pixels = F.interpolate(pixels, size=size, mode=mode, antialias=True)
        return (pixels - self.mean) / self.std

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        logits = self.model(self.prepare(images))
        if logits.shape[-1] != self.num_classes:
            raise ValueError(
                f"the teacher {self.name} returned {logits.shape[-1]} outputs, not "
                f"{self.num_classes}"
            )
        return logits


def load_teacher(
    spec: str,
    *,
    weights: str | None,
    student_mean: Sequence[float],
    student_std: Sequence[float],
    student_size: tuple[int, int],
    device: str | torch.device = "cpu",
) -> Teacher:
    """The teacher `spec` names: an `.onnx` file, `timm:NAME` or `torchvision:NAME` (with
    `weights`, a state-dict file), else weights `load_pretrained` reads (a ViT of any format).

    Args:
        spec: what to load.
        weights: the state dict of a `timm:` / `torchvision:` model; None keeps its random
            initialisation (tests) and says so.
        student_mean, student_std: the student's normalisation.
        student_size: the student's input size, used for an ONNX file of dynamic size.
        device: where the teacher runs (ONNX: onnxruntime's CPU provider).
    """
    norm = {"student_mean": student_mean, "student_std": student_std}
    library, _, name = spec.partition(":")
    if library in LIBRARIES and name:
        model, data_config = _library_model(library, name, weights)
        model = model.to(device)
        classes = _num_classes(model, data_config, device)
        return Teacher(model, num_classes=classes, data_config=data_config, name=spec, **norm)
    if weights is not None:
        raise ValueError(
            f"--teacher-weights is for timm:NAME or torchvision:NAME teachers; {spec} holds "
            "its own weights: drop --teacher-weights"
        )
    path = Path(spec)
    if not path.exists():
        what = (
            "teacher {} does not exist"
            if spec.endswith(".onnx")
            else (
                "teacher {!r} is neither a file nor timm:NAME / torchvision:NAME; give a "
                "checkpoint, an .onnx file, or e.g. timm:resnet18 with --teacher-weights FILE"
            )
        )
        raise ValueError(what.format(spec))
    info = inspect(path)  # what the file is, read once
    if info.error is not None and isinstance(info.error, MissingOptionError):
        raise ValueError(
            f"teacher {spec} is {info.kind}: {info.error.what}; save it as a vitkit checkpoint "
            f"first (vitkit.load_pretrained(path, {info.error.hint(OPTION_FORMS)}), then "
            "vitkit.save)"
        )
    if info.format == "onnx":
        run, classes, data_config = _onnx_model(info, student_mean, student_std, student_size)
        return Teacher(run, num_classes=classes, data_config=data_config, name=spec, **norm)
    model = load_any(info).to(device)  # a vitkit ViT or timm CNN, or any ViT weights
    if not model.num_classes:
        raise ValueError(
            f"teacher {spec} is {info.kind} without a classifier head; distil from a classifier"
        )
    return Teacher(
        model, num_classes=model.num_classes, data_config=model.data_config, name=spec, **norm
    )


def _library_model(library: str, name: str, weights: str | None) -> tuple[nn.Module, DataConfig]:
    """A timm / torchvision model by name, its weights from a file, and its data config."""
    if library == "timm":
        import timm

        try:
            model = timm.create_model(name, pretrained=False)
        except RuntimeError as err:  # timm: "Unknown model (...)"
            raise ValueError(f"timm has no model {name!r} ({err})") from None
        resolved = timm.data.resolve_data_config({}, model=model)
        data_config = DataConfig.from_dict(resolved, f"timm:{name}")
    else:
        import torchvision

        try:
            model = torchvision.models.get_model(name, weights=None)
        except ValueError as err:
            raise ValueError(f"torchvision has no model {name!r} ({err})") from None
        # torchvision's classification weights: ImageNet statistics, 224 crop of a 256 resize.
        data_config = DataConfig(
            input_size=(3, 224, 224),
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            interpolation="bilinear",
            crop_pct=0.875,
        )
    if weights is None:
        log.warning("teacher %s:%s has random weights (no --teacher-weights)", library, name)
        return model, data_config
    state_dict = load_state_dict(weights)
    head = _head_size(state_dict)
    if head is not None and hasattr(model, "reset_classifier"):
        model.reset_classifier(head)  # timm: a teacher trained on other classes
    elif head is not None and hasattr(model, "fc") and isinstance(model.fc, nn.Linear):
        model.fc = nn.Linear(model.fc.in_features, head)  # torchvision ResNets
    load_into(model, state_dict, source=weights)
    return model, data_config


def _head_size(state_dict: dict[str, Tensor]) -> int | None:
    for key in ("fc.weight", "head.fc.weight", "head.weight", "classifier.weight"):
        if key in state_dict and state_dict[key].ndim == 2:
            return state_dict[key].shape[0]
    return None


@torch.no_grad()
def _num_classes(model: nn.Module, data_config: DataConfig, device: str | torch.device) -> int:
    classes = getattr(model, "num_classes", None)
    if isinstance(classes, int) and classes > 0:
        return classes
    probe = torch.zeros(1, *data_config.input_size, device=device)
    return model.eval()(probe).shape[-1]


def _onnx_model(
    info: WeightsInfo,
    student_mean: Sequence[float],
    student_std: Sequence[float],
    student_size: tuple[int, int],
) -> tuple[Callable[[Tensor], Tensor], int, DataConfig]:
    """onnxruntime on an .onnx classifier; its data config from vitkit's metadata (`inspect`),
    else the graph's fixed input size (or the student's) with the student's normalisation."""
    import onnxruntime

    path = info.weights_file
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own types for bad files
        raise ValueError(f"teacher {path} is not a readable ONNX model ({err})") from None
    (graph_input,) = session.get_inputs()
    data_config = info.data_config
    if data_config is None:
        shape = graph_input.shape  # (B, C, H, W); symbolic dims are strings
        chans = shape[1] if isinstance(shape[1], int) else len(student_mean)
        fixed = all(isinstance(side, int) for side in shape[2:])
        height, width = (shape[2], shape[3]) if fixed else student_size
        log.info("teacher %s has no data config: the student's normalisation is used", path)
        repeat = chans if len(student_mean) == 1 else 1  # grey student, RGB teacher
        data_config = DataConfig(
            input_size=(chans, height, width),
            mean=tuple(student_mean) * repeat,
            std=tuple(student_std) * repeat,
        )
    name = graph_input.name

    def run(x: Tensor) -> Tensor:
        (logits,) = session.run(None, {name: x.detach().float().cpu().numpy()})
        return torch.from_numpy(logits).to(x.device)

    probe = torch.zeros(1, *data_config.input_size)
    return run, int(run(probe).shape[-1]), data_config
