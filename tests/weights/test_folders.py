"""Export folders: transformers and timm load them as the same model (identical logits), with
the model's data config as their own preprocessing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _parity import TOL, images, randomize
from PIL import Image

import vitkit
import vitkit.cli
from vitkit.data import eval_transform
from vitkit.data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from vitkit.weights.vit.folders import save_hf_folder, save_timm_folder

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
    "data",
    [
        dict(interpolation="bilinear", crop_mode="squash"),
        dict(interpolation="bicubic", crop_pct=0.875),
    ],
)
def test_transformers_loads_the_hf_folder(tmp_path, data):
    transformers = pytest.importorskip("transformers")
    model = _model(**data)
    save_hf_folder(model, tmp_path)
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    assert theirs.config.id2label == dict(enumerate(NAMES))
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(theirs(pixel_values=x).logits, model(x), **TOL)
    image_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    assert type(image_processor).__name__ == "TimmWrapperImageProcessor"
    back = vitkit.load_pretrained(tmp_path)
    assert back.data_config == model.data_config
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), **TOL)


def _pictures() -> list[Image.Image]:
    """Odd and even sides, wide, tall and square: the resized long side minus the crop takes
    every remainder mod 4 over the grid below."""
    rng = np.random.default_rng(0)
    shapes = [(45, 60), (61, 90), (100, 37), (50, 50), (33, 101), (71, 64)]
    return [Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)) for shape in shapes]


# input size x crop_pct x crop mode x filter: 5 * 4 * 2 sizes-and-modes, 3 filters in turn
PREPROCESSING = [
    dict(input_size=(3, h, w), crop_pct=pct, crop_mode=mode, interpolation=interpolation)
    for i, ((h, w), pct, mode) in enumerate(
        (size, pct, mode)
        for size in ((17, 17), (24, 24), (29, 29), (32, 32), (24, 33))
        for pct in (1.0, 0.95, 0.875, 0.8)
        for mode in ("center", "squash")
    )
    for interpolation in [("bicubic", "bilinear", "nearest")[i % 3]]
]


@pytest.mark.parametrize(
    "data",
    PREPROCESSING,
    ids=lambda d: "{input_size[1]}x{input_size[2]}-{crop_pct}-{crop_mode}".format(**d),
)
def test_export_folders_prepare_images_pixel_for_pixel_as_vitkit(tmp_path, data):
    """What a user of each folder runs (transformers' AutoImageProcessor; timm's
    create_transform of resolve_data_config on the folder's pretrained_cfg) gives vitkit's
    eval pixels exactly, for odd and even sizes, margins and aspect ratios."""
    transformers = pytest.importorskip("transformers")
    timm = pytest.importorskip("timm")
    config = DataConfig(mean=IMAGENET_MEAN, std=IMAGENET_STD, **data)
    height, width = data["input_size"][1:]
    model = vitkit.VisionTransformer(img_size=(height, width), patch_size=math.gcd(height, width),
                                     embed_dim=8, depth=1, num_heads=1, num_classes=3)  # fmt: skip
    model.data_config = config
    save_hf_folder(model, tmp_path / "hf")
    save_timm_folder(model, tmp_path / "timm")
    hf = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    pretrained_cfg = json.loads((tmp_path / "timm" / "config.json").read_text())["pretrained_cfg"]
    timm_transform = timm.data.create_transform(
        **timm.data.resolve_data_config({}, pretrained_cfg=pretrained_cfg), is_training=False
    )
    ours = eval_transform(config)
    for picture in _pictures():
        expected = ours(picture)
        assert expected.shape == data["input_size"]
        torch.testing.assert_close(hf(picture)["pixel_values"][0], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(timm_transform(picture), expected, atol=1e-6, rtol=0)


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


# Model options a timm folder carries, each family's mix: the block / MLP class comes from the
# architecture named in config.json, every other option from model_args.
TIMM_FOLDER_OPTIONS = {
    "registers": dict(reg_tokens=2, no_embed_class=True),
    "aimv2": dict(mlp_layer="swiglu", norm_layer="rmsnorm", embed_norm=True, act_layer="silu",
                  class_token=False, global_pool="avg", qkv_bias=False, proj_bias=False),
    "dinov2": dict(mlp_layer="swiglu_packed", reg_tokens=4, init_values=1e-5, act_layer="silu"),
    "res_post_norm": dict(res_post_norm=True, init_values=1e-5, class_token=False,
                          global_pool="avg", qkv_bias=False),
    "map_qk_norm": dict(global_pool="map", qk_norm=True, act_layer="gelu_tanh"),
    "clip_avgmax": dict(global_pool="avgmax", act_layer="quick_gelu", pre_norm=True,
                        patch_bias=False, scale_attn_norm=True, scale_mlp_norm=True),
    "tokens": dict(global_pool="none", num_classes=0, final_norm=False, class_token=False),
    "distilled": dict(distilled=True, dynamic_img_size=True, dynamic_img_pad=True),
}  # fmt: skip


@pytest.mark.parametrize("options", TIMM_FOLDER_OPTIONS.values(), ids=TIMM_FOLDER_OPTIONS)
def test_timm_folders_carry_every_option_timm_can_express(tmp_path, options):
    timm = pytest.importorskip("timm")
    model = randomize(vitkit.VisionTransformer(
        **{**dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3),
           **options}))  # fmt: skip
    save_timm_folder(model, tmp_path)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), **TOL)
    back = vitkit.load_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), **TOL)


def _small(**options) -> vitkit.VisionTransformer:
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4)
    return vitkit.VisionTransformer(**{**base, **options})


@pytest.mark.parametrize(
    "save, options, message",
    [
        (save_timm_folder, dict(norm_eps=1e-5),
         "a timm config.json names norms without their eps (timm's is 1e-6); this model has "
         "norm_eps=1e-05; export --format hf instead (or keep vitkit's own checkpoint)"),
        (save_timm_folder, dict(mlp_layer="swiglu", res_post_norm=True),
         "no timm architecture builds res_post_norm=True with mlp_layer='swiglu' (timm takes "
         "each from a different model factory); keep vitkit's own checkpoint (vitkit.save), "
         "which holds every option"),
        (save_timm_folder, dict(conv_stem=(8,)),
         "timm's VisionTransformer has no conv stem like vitkit's conv_stem (its hybrids use "
         "ResNetV2, vitkit's hybrid='resnetv2'); only models with conv_stem=() convert to timm; "
         "keep vitkit's own checkpoint (vitkit.save), which holds every option"),
        (save_hf_folder, dict(global_pool="map"),
         "Hugging Face's ViT cannot express this model; it needs a class token with "
         "global_pool='token'; export --format timm instead (or keep vitkit's own checkpoint)"),
        (save_hf_folder, dict(mlp_layer="swiglu", qk_norm=True),
         "Hugging Face's ViT cannot express this model; it needs the paper's layers (not "
         "qk_norm=True, mlp_layer='swiglu'); export --format timm instead (or keep vitkit's own "
         "checkpoint)"),
        (save_hf_folder, dict(norm_layer="rmsnorm", norm_eps=1e-5),
         "Hugging Face's ViT cannot express this model; it needs the paper's layers (not "
         "norm_layer='rmsnorm'); keep vitkit's own checkpoint (vitkit.save), which holds every "
         "option"),
    ],
)  # fmt: skip
def test_what_a_folder_cannot_express_is_refused_before_writing(tmp_path, save, options, message):
    with pytest.raises(ValueError) as err:
        save(_small(**options), tmp_path / "out")
    assert str(err.value) == message
    assert not (tmp_path / "out").exists()


def test_a_refused_folder_is_one_error_line_on_the_command_line(tmp_path, capsys):
    vitkit.save(_small(mlp_layer="swiglu", res_post_norm=True), tmp_path / "m.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--format", "timm"]
    assert vitkit.cli.main([*argv, str(tmp_path / "timm")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitkit: error: no timm architecture builds res_post_norm=True with ")
    assert err.endswith("keep vitkit's own checkpoint (vitkit.save), which holds every option")
    assert "\n" not in err and not (tmp_path / "timm").exists()


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
