"""COCO-format detection data: the synthetic shapes set, its reader, and COCO mAP."""

import json

import pytest
import torch

from vitkit.data.detection import CocoDetection, coco_map, collate_detection, make_shapes_coco

requires_pycocotools = pytest.mark.requires("pycocotools", extra="detection")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    return folder, make_shapes_coco(folder, count=6, size=(48, 64), side=(10, 20), seed=3)


def test_shapes_are_a_coco_json_whose_boxes_hold_the_shapes(shapes):
    folder, path = shapes
    coco = json.loads(path.read_text())
    assert [c["name"] for c in coco["categories"]] == ["square", "disc"]
    assert len(coco["images"]) == 6 and 6 <= len(coco["annotations"]) <= 18
    data = CocoDetection(folder, path)
    image, target = data[0]
    assert image.shape == (3, 48, 64) and 0 <= image.min() and image.max() <= 1
    first = [a for a in coco["annotations"] if a["image_id"] == 1]
    assert target["image_id"] == 1 and target["labels"].tolist() == [
        a["category_id"] for a in first
    ]
    for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
        inside = image[:, int(y1) : int(y2), int(x1) : int(x2)]
        bright = (inside.min(0).values >= 128 / 255).float().mean()  # shapes are >= 128
        assert bright > (0.99 if label == 1 else 0.7)  # a disc fills pi / 4 of its box
        assert x2 - x1 == y2 - y1 and 10 <= x2 - x1 <= 20
    images, targets = collate_detection([data[0], data[1]])
    assert len(images) == len(targets) == 2


@requires_pycocotools
def test_coco_map_of_exact_shifted_and_no_detections(shapes):
    folder, path = shapes
    data = CocoDetection(folder, path)

    def detections(shift):
        found = []
        for _, target in (data[i] for i in range(len(data))):
            boxes = target["boxes"] + shift
            scores = torch.ones(len(boxes))
            found.append({"image_id": target["image_id"], "boxes": boxes, "scores": scores,
                          "labels": target["labels"]})  # fmt: skip
        return found

    exact = coco_map(path, detections(0.0))
    assert exact["mAP"] == pytest.approx(1.0) and exact["mAP50"] == pytest.approx(1.0)
    shifted = coco_map(path, detections(2.0))  # IoU 0.47 (10 px boxes) to 0.68 (20 px)
    assert 0 < shifted["mAP"] < exact["mAP"] and shifted["mAP75"] < 1.0
    assert coco_map(path, [])["mAP"] == 0.0
