"""The data config travels with the weights: read from timm Hub folders (equal to timm's
`resolve_data_config`), Hugging Face processor files, vitkit checkpoints and the family
defaults; stored in every checkpoint; doctored values refused."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError
from vitkit.data.data_config import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, DataConfig
from vitkit.weights.preprocessing import default_data_config, hf_data_config

TIMM_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


@pytest.mark.parametrize(
    "name",
    ["deit_tiny_patch16_224.fb_in1k", "vit_tiny_patch16_384.augreg_in21k_ft_in1k"],
)
def test_a_timm_hub_folder_brings_timms_data_config(tmp_path, name):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    source = randomize(timm.create_model(name, pretrained=False, depth=2))
    save_for_hf(source, str(tmp_path), safe_serialization=True)
    model = vitkit.load_pretrained(tmp_path)
    expected = timm.data.resolve_data_config({}, model=source)
    ours = model.data_config.to_dict()
    assert {k: ours[k] for k in TIMM_KEYS} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in expected.items() if k in TIMM_KEYS
    }
    size = expected["input_size"][1]
    x = images(size, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


def test_hugging_face_processors():
    transformers = pytest.importorskip("transformers")
    config = vitkit.create_model("vit_tiny_patch16_224").config
    vit = hf_data_config(transformers.ViTImageProcessor().to_dict(), config, "vit")
    assert vit == DataConfig(
        input_size=(3, 224, 224),
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        interpolation="bilinear",
        crop_pct=1.0,
        crop_mode="squash",
    )
    clip = hf_data_config(transformers.CLIPImageProcessor().to_dict(), config, "clip")
    assert clip == DataConfig(
        input_size=(3, 224, 224),
        mean=CLIP_MEAN,
        std=CLIP_STD,
        interpolation="bicubic",
        crop_pct=1.0,
        crop_mode="center",
    )
    wider = transformers.CLIPImageProcessor(size={"shortest_edge": 256}).to_dict()
    assert hf_data_config(wider, config, "clip").crop_pct == 224 / 256


def test_a_hugging_face_folder_brings_its_processor(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=3,
    )
    transformers.ViTForImageClassification(cfg).save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD
    )
    processor.save_pretrained(tmp_path)
    model = vitkit.load_pretrained(tmp_path, img_size=48)
    assert model.data_config == DataConfig(
        input_size=(3, 48, 48),  # follows the model's new input size
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        interpolation="bilinear",
        crop_mode="squash",
    )
    (tmp_path / "preprocessor_config.json").write_text('{"resample": 9}')
    with pytest.raises(CheckpointError, match=r"preprocessor_config\.json: unusable .*resample 9"):
        vitkit.load_pretrained(tmp_path)


def test_torchvision_and_jax_defaults():
    config = vitkit.create_model("vit_base_patch16_224").config
    torchvision = default_data_config("torchvision", config)
    assert (torchvision.mean, torchvision.interpolation, torchvision.crop_pct) == (
        IMAGENET_MEAN,
        "bilinear",
        0.875,
    )
    jax = default_data_config("jax", config)
    assert (jax.mean, jax.std, jax.interpolation, jax.crop_pct) == (
        (0.5,) * 3,
        (0.5,) * 3,
        "bicubic",
        0.9,
    )


def test_the_data_config_is_saved_with_the_model(tmp_path):
    model = vitkit.create_model("vit_digits")
    model.data_config = DataConfig(
        input_size=(1, 8, 8), mean=0.3, std=0.2, interpolation="bicubic", crop_pct=0.9
    )
    vitkit.save(
        model, tmp_path / "m.safetensors", meta={"class_names": [str(i) for i in range(10)]}
    )
    loaded = vitkit.load(tmp_path / "m.safetensors")
    assert loaded.data_config == model.data_config
    assert loaded.meta["data_config"]["mean"] == [0.3]
    assert vitkit.load_pretrained(tmp_path / "m.safetensors").data_config == model.data_config
    # A file written before data configs: its training mean / std, resized without a crop.
    del model.data_config
    vitkit.save(model, tmp_path / "old.safetensors", meta={"mean": [0.4], "std": [0.3]})
    old = vitkit.load(tmp_path / "old.safetensors").data_config
    assert (old.mean, old.std, old.crop_mode, old.input_size) == (
        (0.4,),
        (0.3,),
        "squash",
        (1, 8, 8),
    )


@pytest.mark.parametrize(
    "values, pattern",
    [
        ({"input_size": [3, 8], "mean": 0.5, "std": 0.5}, r"input_size must be a list of 3 int"),
        ({"input_size": [3, 8, 8], "mean": [0.5], "std": 0.5}, r"mean must be 3 finite"),
        ({"input_size": [3, 8, 8], "mean": 0.5, "std": 0}, r"std must be > 0"),
        ({"input_size": [1, 8, 8], "mean": 0.5, "std": 0.5, "crop_pct": 2}, r"crop_pct must"),
        ({"input_size": [1, 8, 8], "mean": "nan", "std": 0.5}, r"mean must be a number or a list"),
        ({"input_size": [1, 8, 8], "mean": float("nan"), "std": 0.5}, r"mean must be a finite"),
        ({"input_size": [1, 8, 8], "mean": 0.5, "std": 0.5, "interpolation": "x"}, "unknown"),
        ({"mean": 0.5, "std": 0.5}, r"lacks input_size"),
    ],
)
def test_a_doctored_data_config_is_refused(tmp_path, values, pattern):
    model = vitkit.create_model("vit_digits")
    path = tmp_path / "m.safetensors"
    vitkit.save(model, path, meta={"data_config": values})
    with pytest.raises(CheckpointError, match=pattern) as err:
        vitkit.load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
