"""The model a server answers with, loaded once (`inference.Predictor`): images prepared as
`vitkit predict` prepares them, class scores from the same `Predictor.predict` (a multi-label
model's: the labels over its threshold, `Predictor.labels`), explanations from
`Predictor.explain`, drawn as one overlay PNG."""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from ..explain import MAPS as EXPLANATION_MAPS
from ..explain import Explanation, class_index, map_title
from ..explain import overlay_png as draw_overlay_png
from ..inference import Predictor, source_name

log = logging.getLogger(__name__)

MAPS = EXPLANATION_MAPS["attention"]  # the maps /explain draws, by name (the first by default)


class Service:
    """A classifier loaded once, for every request.

    Args:
        predictor: `inference.load_for_inference` with `explanations=True` (an int8 model
            then keeps an fp32 copy to explain with), or `inference.Predictor` of a model in
            hand.
        name: what answers name the model by (default: the predictor's name, its weights).
    """

    def __init__(self, predictor: Predictor, *, name: str | None = None) -> None:
        self.predictor = predictor
        self.name = name or predictor.name
        self.class_names = predictor.class_names
        self.data_config = predictor.data_config
        self.precision = predictor.precision
        self.platform = predictor.platform  # the Open Inference Protocol's name of the runtime

    @property
    def in_chans(self) -> int:
        return self.predictor.in_chans

    @property
    def short_name(self) -> str:
        """The model's name in URLs (the Open Inference Protocol's /v2/models/{name})."""
        return source_name(self.name)

    def example_image(self) -> Tensor:
        """A (C, H, W) image of the model's input size (zeros), to warm the model up with."""
        return torch.zeros(self.data_config.input_size)

    def prepare(self, image: Image.Image) -> Tensor:
        """A decoded image -> the normalised (C, H, W) tensor the model takes."""
        return self.predictor.prepare(image)

    def predict(self, images: Tensor, topk: Sequence[int]) -> list[list[dict[str, Any]]]:
        """Each image's `topk[i]` most probable classes, most probable first, as `vitkit
        predict --json` lists them: {class, index, probability (6 decimals)}; a multi-label
        model's are the classes whose sigmoid reaches its threshold (`topk` does not cut them)."""
        if getattr(self.predictor, "multi_label", False):
            return [
                [
                    {"class": self.class_names[i], "index": i, "probability": round(q, 6)}
                    for q, i in found
                ]
                for found in self.predictor.labels(images)
            ]
        probs, indices = self.predictor.predict(images, max(topk))
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
        """The maps of one image's bytes (already checked by `uploads.decode_image`);
        `map_name` must be one the model's explanation gives (a Swin's Grad-CAM: relevance)."""
        maps = self.predictor.maps
        if maps and map_name not in maps:  # Grad-CAM's one map
            raise ValueError(
                f"{self.name} has no attention over the whole image: its map is Grad-CAM, "
                f"map={maps[0]}; {map_name} is a ViT's attention map"
            )
        file = io.BytesIO(data)
        file.name = name
        return self.predictor.explain(file, target=target)

    def info(self) -> dict[str, Any]:
        """What /info says of the model."""
        return {
            "model": self.name,
            "classes": self.class_names,
            "data_config": self.data_config.to_dict(),
            "precision": self.precision,
            "device": str(self.predictor.device),
            "explain": self.predictor.explanation is not None,
            "multi_label": getattr(self.predictor, "multi_label", False),
            "threshold": getattr(self.predictor, "threshold", None),
        }


def overlay_png(
    explained: Explanation, map_name: str, names: Sequence[str], method: str | None
) -> bytes:
    """/explain's picture: the map over the model's view with its colour bar, captioned with
    the predicted class and its probability, the map and its method (`explanation_method`),
    and the view's caption, as `vitkit explain` draws its panels; PNG bytes."""
    k, t = explained.predicted, explained.target
    title = (
        f"predicted {names[k]} ({float(explained.probabilities[k]):.3f}); "
        f"{map_title(map_name, method, names[t])}"
    )
    heat = explained.maps[map_name]
    return draw_overlay_png(explained.image, heat, title=title, caption=explained.caption)


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
