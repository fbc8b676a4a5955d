"""The model a server answers with, loaded once: images prepared as `vitkit predict` prepares
them (`data.eval_transform` of the weights' data config), class scores from the same
`train.predict`, explanations from `explain.explain_image` and drawn as one overlay PNG."""

from __future__ import annotations

import copy
import io
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from ..data import eval_transform
from ..explain import Explanation, class_index, explain_image
from ..model import SwinTransformer, VisionTransformer
from ..model.precision import model_device, set_precision
from ..train import predict

log = logging.getLogger(__name__)

MAPS = ("relevance", "rollout", "cls_attention")  # the maps /explain draws, by name
OVERLAY_SIDE = 224  # the overlay's shorter side in pixels: small views are enlarged to it


class Service:
    """A classifier loaded once, for every request.

    Args:
        model: a classifier with a `data_config` (as `weights.load_any` gives), in fp32.
        name: what answers name the model by (e.g. the checkpoint's path).
        precision: 'fp32', 'bf16' or 'int8' (`model.precision.set_precision`); int8 models
            have no gradients, so explanations run on an fp32 copy kept for them.
    """

    def __init__(self, model: nn.Module, *, name: str, precision: str = "fp32") -> None:
        if getattr(model, "data_config", None) is None:
            raise ValueError(
                "the model has no data config; load it with vitkit.load or vitkit.load_pretrained "
                "(or set model.data_config) so that images are prepared as for its weights"
            )
        self.name = name
        self.data_config = model.data_config
        self.class_names: list[str] = list(getattr(model, "meta", {}).get("class_names") or [])
        self.class_names = self.class_names or [str(i) for i in range(model.num_classes)]
        explainable = isinstance(model, (VisionTransformer, SwinTransformer))
        keep_fp32 = explainable and precision == "int8"
        self.explainer: nn.Module | None = copy.deepcopy(model).eval() if keep_fp32 else None
        self.precision = set_precision(model, precision)
        self.model = model
        if explainable and self.explainer is None:
            self.explainer = model
        self.device = model_device(model)
        self._prepare = eval_transform(self.data_config)

    @property
    def in_chans(self) -> int:
        return self.data_config.input_size[0]

    def prepare(self, image: Image.Image) -> Tensor:
        """A decoded image -> the normalised (C, H, W) tensor the model takes."""
        return self._prepare(image)

    def predict(self, images: Tensor, topk: Sequence[int]) -> list[list[dict[str, Any]]]:
        """Each image's `topk[i]` most probable classes, most probable first, as `vitkit
        predict --json` lists them: {class, index, probability (6 decimals)}."""
        with torch.inference_mode():
            probs, indices = predict(self.model, images.to(self.device), topk=max(topk))
        return [
            [
                {"class": self.class_names[i], "index": i, "probability": round(q, 6)}
                for q, i in zip(p[:k], ix[:k])
            ]
            for p, ix, k in zip(probs.tolist(), indices.tolist(), topk)
        ]

    def target(self, text: str | None) -> int | None:
        """The class to explain: a class name or an index (None: the predicted one)."""
        return None if text is None else class_index(text, self.class_names, given_as="class")

    def explain(
        self, data: bytes, name: str, target: int | None, map_name: str = "relevance"
    ) -> Explanation:
        """The maps of one image's bytes (already checked by `uploads.decode_image`); a Swin
        has one, `relevance` (its Grad-CAM), which `map_name` must then name."""
        if self.explainer is None:
            raise ValueError(
                f"{self.name} is no ViT or Swin (a timm CNN has no attention to draw); /explain "
                "needs a ViT or Swin checkpoint"
            )
        if isinstance(self.explainer, SwinTransformer) and map_name != "relevance":
            raise ValueError(
                f"{self.name} is a Swin Transformer: its map is Grad-CAM, map=relevance; "
                f"{map_name} is a ViT's attention map"
            )
        file = io.BytesIO(data)
        file.name = name
        return explain_image(self.explainer, file, self.data_config, target=target)

    def info(self) -> dict[str, Any]:
        """What /info says of the model."""
        return {
            "model": self.name,
            "classes": self.class_names,
            "data_config": self.data_config.to_dict(),
            "precision": self.precision,
            "device": str(self.device),
            "explain": self.explainer is not None,
        }


def overlay_png(image: Tensor, heat: Tensor, *, side: int = OVERLAY_SIDE) -> bytes:
    """`heat` (gh, gw) scaled to [0, 1], coloured (matplotlib's jet) and blended at half
    opacity over `image` (C, h, w) in [0, 1], both resized bilinearly so that the shorter side
    is at least `side` pixels, as in `explain.draw_explanation`'s panels; PNG bytes."""
    from matplotlib import colormaps

    height, width = image.shape[-2:]
    scale = max(1.0, side / min(height, width))
    size = (round(height * scale), round(width * scale))
    view = F.interpolate(image.float()[None], size=size, mode="bilinear", align_corners=False)
    view = view[0].clamp(0, 1).expand(3, *size)  # (3, H, W): grey views in colour
    up = F.interpolate(heat.float()[None, None], size=size, mode="bilinear", align_corners=False)
    up = up[0, 0]  # (H, W)
    up = (up - up.min()) / (up.max() - up.min()).clamp_min(1e-12)
    colour = torch.from_numpy(colormaps["jet"](up.numpy())[..., :3]).float()  # (H, W, 3)
    blended = 0.5 * view.permute(1, 2, 0) + 0.5 * colour  # (H, W, 3)
    pixels = (blended * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def explanation_json(explained: Explanation, map_name: str, names: Sequence[str]) -> dict:
    """/explain's JSON: the classes and one map (gh x gw nested lists)."""
    probs = explained.probabilities
    heat = explained.maps[map_name]

    def cls(index: int) -> dict[str, Any]:
        return {"class": names[index], "index": index, "probability": round(float(probs[index]), 6)}

    return {
        "predicted": cls(explained.predicted),
        "target": cls(explained.target),
        "map": map_name,
        "grid": list(heat.shape),
        "values": [[round(float(v), 6) for v in row] for row in heat],
        "caption": explained.caption,
    }
