"""Export folders: transformers and timm load them as the same model (identical logits), with
the model's data config as their own preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _parity import TOL, images, randomize
from PIL import Image

import vitkit
import vitkit.cli
from vitkit.data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from vitkit.weights.folders import save_hf_folder, save_timm_folder

NAMES = ["cat", "dog", "eel"]


def _model(**data) -> vitkit.VisionTransformer:
    model = randomize(vitkit.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2,
                                               num_heads=4, num_classes=3))  # fmt: skip
    model.meta = {"class_names": NAMES}
    model.data_config = DataConfig(
        input_size=(3, 32, 32), mean=IMAGENET_MEAN, std=IMAGENET_STD, **data
    )
    return model


def _photo() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (45, 60, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    "data, processor",
    [
        (dict(interpolation="bilinear", crop_mode="squash"), "ViTImageProcessor"),
        (dict(interpolation="bicubic", crop_pct=0.875), "CLIPImageProcessor"),
    ],
)
def test_transformers_loads_the_hf_folder(tmp_path, data, processor):
    transformers = pytest.importorskip("transformers")
    model = _model(**data)
    save_hf_folder(model, tmp_path)
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    assert theirs.config.id2label == dict(enumerate(NAMES))
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(theirs(pixel_values=x).logits, model(x), **TOL)
    image_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    assert type(image_processor).__name__.startswith(processor.removesuffix("Processor"))
    back = vitkit.load_pretrained(tmp_path)
    assert back.data_config.mean == model.data_config.mean
    assert back.data_config.interpolation == model.data_config.interpolation
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), **TOL)


def test_the_hf_processor_prepares_images_as_timm_does(tmp_path):
    """The exported centre-crop processor gives timm's eval pipeline's pixels (1/255)."""
    transformers = pytest.importorskip("transformers")
    timm = pytest.importorskip("timm")
    model = _model(interpolation="bicubic", crop_pct=0.875)
    save_hf_folder(model, tmp_path)
    image_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    ours = image_processor(_photo(), return_tensors="pt")["pixel_values"][0]
    transform = timm.data.create_transform(**model.data_config.to_dict(), is_training=False)
    expected = transform(_photo())
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    assert ours.shape == expected.shape == (3, 32, 32)
    assert ((ours - expected).abs() * std).max() <= 1.5 / 255


def test_timm_loads_the_timm_folder(tmp_path):
    timm = pytest.importorskip("timm")
    model = _model(interpolation="bicubic", crop_pct=0.9)
    save_timm_folder(model, tmp_path)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), **TOL)
    resolved = timm.data.resolve_data_config({}, model=theirs)
    assert tuple(resolved["mean"]) == IMAGENET_MEAN and resolved["crop_pct"] == 0.9
    assert tuple(resolved["input_size"]) == (3, 32, 32) and resolved["interpolation"] == "bicubic"
    back = vitkit.load_pretrained(tmp_path)
    assert back.data_config == model.data_config


def test_what_a_folder_cannot_express_is_refused(tmp_path):
    model = _model()
    model.config = model.config.replace(norm_eps=1e-5)
    with pytest.raises(ValueError, match="timm's ViT uses LayerNorm eps 1e-6"):
        save_timm_folder(model, tmp_path / "timm")
    pooled = vitkit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, global_pool="avg"
    )
    with pytest.raises(ValueError, match="Hugging Face's ViT cannot express this model"):
        save_hf_folder(pooled, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_folders_from_the_command_line(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    timm = pytest.importorskip("timm")
    model = _model(interpolation="bicubic", crop_pct=0.9)
    vitkit.save(model, tmp_path / "m.safetensors", meta=model.meta)
    x = images(32, batch=2)
    for kind in ("hf", "timm"):
        argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--format", kind]
        assert vitkit.cli.main([*argv, str(tmp_path / kind)]) == 0
        assert f"wrote {tmp_path / kind}/ ({kind} folder" in capsys.readouterr().out
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    tm = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(pixel_values=x).logits, model(x), **TOL)
        torch.testing.assert_close(tm(x), model(x), **TOL)
