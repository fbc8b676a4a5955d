"""The inference room (`vitkit.inference`): weights loaded once into a predictor that prepares,
predicts most probable first, explains by the one method `explanation_method` decides, and
refuses what it cannot do in one line."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import vitkit
from vitkit.data.data_config import DataConfig
from vitkit.explain import explain_image, explanation_method
from vitkit.inference import Predictor, load_for_inference

CLASSES = ["ant", "bee", "cat", "dog", "eel"]


def _vit(num_classes: int = len(CLASSES)) -> nn.Module:
    """A random one-block RGB ViT of 16x16 inputs, its scores far apart."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_digits", num_classes=num_classes, in_chans=3, img_size=16,
                                patch_size=4, embed_dim=16, depth=1, num_heads=2)  # fmt: skip
    if num_classes:
        with torch.no_grad():
            model.head.weight.normal_(0, 2.0)
    model.data_config = DataConfig(input_size=(3, 16, 16), mean=0.5, std=0.25, crop_pct=0.875)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("inference") / "tiny.safetensors"
    vitkit.save(_vit(), path, meta={"class_names": CLASSES})
    return path


def _png(size=(20, 12), seed: int = 0) -> bytes:
    array = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_predict_lists_the_most_probable_classes_first():
    model = _vit()
    predictor = Predictor(model)
    images = torch.randn(3, 3, 16, 16)
    probs, indices = predictor.predict(images, topk=3)
    with torch.no_grad():
        expected, order = torch.softmax(model(images), dim=-1).sort(dim=-1, descending=True)
    assert probs.shape == indices.shape == (3, 3)
    assert torch.equal(indices, order[:, :3])
    torch.testing.assert_close(probs, expected[:, :3])
    assert (probs[:, :-1] > probs[:, 1:]).all()  # strictly: the scores are far apart
    all_probs, all_indices = predictor.predict(images, topk=99)  # at most every class
    assert torch.equal(all_indices, order)
    torch.testing.assert_close(all_probs.sum(-1), torch.ones(3))


def test_load_for_inference_reads_the_weights_with_their_names_and_overrides(checkpoint):
    predictor = load_for_inference(checkpoint, data_overrides={"crop_pct": 0.5})
    assert predictor.class_names == CLASSES and predictor.name == str(checkpoint)
    assert (predictor.precision, predictor.device, predictor.in_chans) == (
        "fp32",
        torch.device("cpu"),
        3,
    )
    assert (predictor.data_config.crop_pct, predictor.data_config.crop_mode) == (0.5, "center")
    assert predictor.explanation == "attention" and predictor.explainer is predictor.model
    image = Image.open(io.BytesIO(_png())).convert("RGB")
    prepared = predictor.prepare(image)
    assert prepared.shape == (3, 16, 16)
    probs, indices = predictor.predict(prepared[None], topk=2)
    with torch.no_grad():
        expected = torch.softmax(vitkit.load(checkpoint)(prepared[None]), -1)[0]
    assert int(indices[0, 0]) == int(expected.argmax())
    torch.testing.assert_close(probs[0, 0], expected.max())
    with pytest.raises(ValueError, match=r"^the image preparation flags: crop_pct must be"):
        load_for_inference(checkpoint, data_overrides={"crop_pct": -1.0})


def test_weights_without_a_head_are_refused_where_class_scores_are_needed(tmp_path):
    path = tmp_path / "headless.safetensors"
    vitkit.save(_vit(num_classes=0), path)
    with pytest.raises(ValueError) as err:
        load_for_inference(path, purpose="eval")
    assert str(err.value) == (
        f"{path} is a vitkit checkpoint without a classifier head; eval needs class scores: "
        f"fine-tune it first (vitkit train --pretrained {path})"
    )
    features = load_for_inference(path, classifier=False)
    assert features.model.num_classes == 0 and features.class_names == []


def test_the_explanation_is_decided_once_per_model():
    swin = vitkit.SwinTransformer(img_size=32, embed_dim=16, depths=(1, 1), num_heads=(1, 2),
                                  window_size=4, num_classes=3)  # fmt: skip
    assert explanation_method(_vit()) == "attention"
    assert explanation_method(swin) == "gradcam"
    assert explanation_method(nn.Linear(2, 2)) is None


def test_a_model_without_an_explanation_is_refused_by_name():
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _vit()
            self.data_config, self.num_classes = self.inner.data_config, len(CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    predictor = Predictor(Plain(), name="plain.pt")
    assert predictor.explanation is None and predictor.maps == () and predictor.explainer is None
    assert predictor.class_names == [str(i) for i in range(len(CLASSES))]
    with pytest.raises(ValueError) as err:
        predictor.explain(io.BytesIO(_png()))
    assert str(err.value) == (
        "plain.pt holds a Plain, which has no attention to draw; explain takes a ViT or Swin "
        "checkpoint"
    )
    with pytest.raises(ValueError, match=r"^Plain has no attention to draw; explain_image takes"):
        explain_image(Plain(), io.BytesIO(_png()), predictor.data_config)
    with pytest.raises(ValueError, match=r"^the model has no data config; load it with"):
        Predictor(nn.Linear(2, 2))


def test_int8_explains_with_an_fp32_copy_only_when_asked(checkpoint):
    plain = load_for_inference(checkpoint, precision="int8")
    assert plain.precision == "int8" and plain.explainer is None
    with pytest.raises(ValueError, match=r"runs in int8, which has no gradients to explain with"):
        plain.explain(io.BytesIO(_png()))
    kept = load_for_inference(checkpoint, precision="int8", explanations=True)
    assert kept.explainer is not kept.model
    assert all(p.dtype == torch.float32 for p in kept.explainer.parameters())
    explained = kept.explain(io.BytesIO(_png()), target=1)
    reference = load_for_inference(checkpoint).explain(io.BytesIO(_png()), target=1)
    assert explained.target == 1 and set(explained.maps) == set(reference.maps)
    torch.testing.assert_close(explained.maps["relevance"], reference.maps["relevance"])
