"""Detection data in the COCO format: a folder of images with one annotations json (Lin et al.,
"Microsoft COCO: Common Objects in Context", ECCV 2014), read into what torchvision's
detectors take, and COCO's box mAP by the reference implementation (pycocotools' `COCOeval`).

`make_shapes_coco` writes a small synthetic set in that format (filled squares and discs on
noisy backgrounds, their boxes known), so a detector trains and is evaluated offline; a real
COCO-format folder is read the same way.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw
from torch import Tensor
from torch.utils.data import Dataset

log = logging.getLogger(__name__)

SHAPES = ("square", "disc")
COCO_METRICS = ("mAP", "mAP50", "mAP75", "mAP_small", "mAP_medium", "mAP_large")


def make_shapes_coco(
    folder: str | Path,
    *,
    count: int,
    size: tuple[int, int] = (96, 128),
    objects: tuple[int, int] = (1, 3),
    side: tuple[int, int] = (16, 40),
    seed: int = 0,
) -> Path:
    """Write `count` images (height, width = `size`) of 1 to 3 filled squares and discs
    (categories 1 and 2, sides in `side` pixels, random colours) on noisy backgrounds into
    `folder`, with their boxes in `folder/annotations.json` (COCO format); returns its path."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for image_id in range(1, count + 1):
        name = f"{image_id:06d}.png"
        image, boxes = _draw_shapes(rng, size, objects, side)
        image.save(folder / name)
        images.append({"id": image_id, "file_name": name, "height": size[0], "width": size[1]})
        for category, (x, y, w, h) in boxes:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(SHAPES)]
    path = folder / "annotations.json"
    coco = {"images": images, "annotations": annotations, "categories": categories}
    path.write_text(json.dumps(coco))
    return path


def _draw_shapes(
    rng: random.Random, size: tuple[int, int], objects: tuple[int, int], side: tuple[int, int]
) -> tuple[Image.Image, list[tuple[int, tuple[int, int, int, int]]]]:
    """One image and its (category, (x, y, w, h)) boxes."""
    height, width = size
    noise = bytes(rng.randrange(0, 96) for _ in range(height * width * 3))
    image = Image.frombytes("RGB", (width, height), noise)
    draw = ImageDraw.Draw(image)
    boxes = []
    for _ in range(rng.randint(*objects)):
        category = rng.randint(1, len(SHAPES))
        length = rng.randint(*side)
        x, y = rng.randint(0, width - length), rng.randint(0, height - length)
        colour = tuple(rng.randrange(128, 256) for _ in range(3))
        corners = (x, y, x + length - 1, y + length - 1)
        if SHAPES[category - 1] == "square":
            draw.rectangle(corners, fill=colour)
        else:
            draw.ellipse(corners, fill=colour)
        boxes.append((category, (x, y, length, length)))
    return image, boxes


class CocoDetection(Dataset):
    """A COCO-format folder for torchvision's detectors: item i is (image (3, H, W) in [0, 1],
    target {'boxes': (K, 4) x1 y1 x2 y2, 'labels': (K,), 'image_id': int}); crowd boxes are
    left out, as torchvision's reference scripts do.

    Args:
        folder: where the images are (`file_name` is relative to it).
        annotations: the COCO json.
    """

    def __init__(self, folder: str | Path, annotations: str | Path) -> None:
        self.folder = Path(folder)
        self.annotations = Path(annotations)
        coco = json.loads(self.annotations.read_text())
        self.images = sorted(coco["images"], key=lambda image: image["id"])
        self.categories = {c["id"]: c["name"] for c in coco["categories"]}
        self.boxes: dict[int, list[dict[str, Any]]] = {image["id"]: [] for image in self.images}
        for annotation in coco["annotations"]:
            if not annotation.get("iscrowd", 0):
                self.boxes[annotation["image_id"]].append(annotation)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        info = self.images[index]
        with Image.open(self.folder / info["file_name"]) as image:
            rgb = image.convert("RGB")
            pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
        image_tensor = pixels.reshape(rgb.height, rgb.width, 3).permute(2, 0, 1)  # (3, H, W)
        found = self.boxes[info["id"]]
        boxes = torch.tensor([a["bbox"] for a in found], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # (x, y, w, h) -> (x1, y1, x2, y2)
        labels = torch.tensor([a["category_id"] for a in found], dtype=torch.int64)
        target = {"boxes": boxes, "labels": labels, "image_id": info["id"]}
        return image_tensor.float() / 255, target


def collate_detection(batch: Sequence[tuple[Tensor, dict[str, Any]]]) -> tuple[list, list]:
    """A batch as torchvision's detectors take it: a list of images, a list of targets."""
    images, targets = zip(*batch)
    return list(images), list(targets)


def coco_map(annotations: str | Path, detections: Sequence[dict[str, Any]]) -> dict[str, float]:
    """COCO box mAP (pycocotools' `COCOeval`) of `detections`: per image a dict with
    'image_id' and the detector's 'boxes' (K, 4) x1 y1 x2 y2, 'scores' and 'labels'. Returns
    'mAP' (IoU 0.5:0.95), 'mAP50', 'mAP75' and by object size."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "COCO mAP needs pycocotools: pip install 'vitkit[detection]'"
        ) from None
    results = []
    for found in detections:
        for box, score, label in zip(
            found["boxes"].tolist(), found["scores"].tolist(), found["labels"].tolist()
        ):
            x1, y1, x2, y2 = box
            results.append(
                {
                    "image_id": int(found["image_id"]),
                    "category_id": int(label),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    if not results:
        return dict.fromkeys(COCO_METRICS, 0.0)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # pycocotools prints its progress and table
        truth = COCO(str(annotations))
        evaluation = COCOeval(truth, truth.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    log.debug("%s", printed.getvalue())
    return {name: float(value) for name, value in zip(COCO_METRICS, evaluation.stats)}
