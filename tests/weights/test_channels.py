"""Weights of one channel count on data of another (weights/channels.py): the first
convolution adapted as timm's `adapt_input_conv`, for a ViT (plain, the paper's conv stem, the
ResNet hybrid), a Swin and an EVA, and `vitkit train --pretrained <RGB weights>` on grey data
(the built-in digits, Fashion-MNIST)."""

from __future__ import annotations

import gzip
import logging
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import cli, load_pretrained
from vitkit.data.data_config import IMAGENET_MEAN, IMAGENET_STD, DataConfig, channel_stats
from vitkit.model.layers import adapt_input_conv

timm = optional_import("timm")

TINY_VIT = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=5)
TINY_SWIN = dict(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1),
                 num_heads=(1, 2), num_classes=5)  # fmt: skip
TINY_EVA = dict(img_size=28, depth=1, embed_dim=64, num_heads=2, num_classes=5)

# name -> (preset, sizes): each family, and the ViT's two stems before the patches
MODELS = {
    "vit": ("vit_tiny_patch16_224", TINY_VIT),
    "vit-conv-stem": ("vit_tiny_patch16_224", {**TINY_VIT, "conv_stem": (8, 16), "patch_size": 1}),
    "swin": ("swin_tiny_patch4_window7_224", TINY_SWIN),
    "eva": ("eva02_tiny_patch14_224", TINY_EVA),
}  # fmt: skip


@requires_timm
@pytest.mark.parametrize("in_chans", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_adapt_input_conv_is_timms(in_chans, dtype):
    from timm.models._manipulate import adapt_input_conv as timm_adapt

    weight = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(in_chans)).to(dtype)
    ours = adapt_input_conv(in_chans, weight.clone())
    assert ours.dtype == dtype and ours.shape == (8, in_chans, 4, 4)
    assert torch.equal(ours, timm_adapt(in_chans, weight.clone()))


@requires_timm
def test_adapt_input_conv_of_a_space_to_depth_stem_and_its_refusals():
    from timm.models._manipulate import adapt_input_conv as timm_adapt

    weight = torch.randn(8, 12, 3, 3)  # 4 spatial groups of RGB
    assert torch.equal(adapt_input_conv(1, weight), timm_adapt(1, weight))
    with pytest.raises(NotImplementedError, match="12 input channels pretrained on 3"):
        adapt_input_conv(4, weight)
    with pytest.raises(ValueError, match="must be positive"):
        adapt_input_conv(0, weight)


def test_channel_stats_follow_the_kernels():
    assert channel_stats(IMAGENET_MEAN, 1) == pytest.approx((0.449,))
    assert channel_stats(IMAGENET_STD, 4) == (0.229, 0.224, 0.225, 0.229)
    assert channel_stats((0.5,), 3) == (0.5, 0.5, 0.5)
    config = DataConfig(input_size=(3, 8, 8), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    grey = config.for_channels(1)
    assert grey.input_size == (1, 8, 8) and grey.std == pytest.approx((0.226,))


def _source(name: str, in_chans: int = 3) -> torch.nn.Module:
    preset, sizes = MODELS[name]
    torch.manual_seed(0)
    return randomize(vitkit.create_model(preset, **sizes, in_chans=in_chans))


@pytest.mark.parametrize("name", list(MODELS))
def test_grey_through_summed_kernels_is_rgb_through_the_original(name, tmp_path, caplog):
    """The property that justifies summing: the adapted model on a grey image gives what the
    RGB model gives on that image repeated to three channels."""
    rgb = _source(name)
    vitkit.save(rgb, tmp_path / "rgb.safetensors")
    with caplog.at_level(logging.INFO, logger="vitkit.weights.channels"):
        grey = load_pretrained(tmp_path / "rgb.safetensors", in_chans=1)
    first_conv = "patch_embed.backbone.0" if name == "vit-conv-stem" else "patch_embed.proj"
    assert caplog.messages == [
        f"the weights take 3-channel images, the model 1: {first_conv} summed over its 3 "
        "channels as timm's adapt_input_conv"
    ]
    assert grey.config.in_chans == 1 and grey.data_config.input_size[0] == 1
    size = rgb.patch_embed.img_size
    x = torch.randn(2, 1, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(grey(x), rgb(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=0)


def test_rgb_through_repeated_kernels_of_grey_weights(tmp_path):
    """The reverse (RGB data on weights of one channel): the kernel repeated and scaled by
    1/3, so an image of three equal channels gives what the grey model gave."""
    grey = _source("vit", in_chans=1)
    vitkit.save(grey, tmp_path / "grey.safetensors")
    rgb = load_pretrained(tmp_path / "grey.safetensors", in_chans=3)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(rgb(x.expand(-1, 3, -1, -1)), grey(x), atol=1e-5, rtol=0)


@requires_timm
def test_the_hybrid_stem_is_adapted_as_timm_does():
    """timm's hybrid with a ResNet stem: its weight-standardised stem convolution is adapted
    as timm's `create_model(..., in_chans=1, pretrained=True)` adapts it (summing does not
    commute with the standardisation, so this equals timm rather than the RGB model)."""
    sizes = dict(img_size=32, embed_dim=32, depth=1, num_heads=2, num_classes=5)
    source = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, **sizes)
    theirs = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, in_chans=1, **sizes)
    state = {**source.state_dict()}
    key = "patch_embed.backbone.conv.weight"
    theirs.load_state_dict({**state, key: adapt_input_conv(1, state[key])})
    ours = load_pretrained(state, in_chans=1, num_heads=2)
    assert torch.equal(ours.state_dict()[key], adapt_input_conv(1, state[key]))
    x = torch.randn(1, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs.eval()(x), atol=1e-5, rtol=0)


# -- vitkit train --pretrained <RGB weights> on grey data ---------------------------------


def _train(argv: list[str], run: Path, capsys) -> torch.nn.Module:
    argv = ["train", *argv, "--epochs", "1", "--batch-size", "32", "--train-limit", "64",
            "--out", str(run), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    return vitkit.load(run / "model.safetensors")


def test_fine_tune_rgb_vitkit_weights_on_digits(tmp_path, capsys):
    source = tmp_path / "rgb.safetensors"
    vitkit.save(_source("vit"), source)
    model = _train(["--pretrained", str(source), "--data", "digits"], tmp_path / "run", capsys)
    assert model.config.in_chans == 1 and model.config.num_classes == 10
    assert model.data_config.input_size == (1, 16, 16)
    assert model.data_config.mean == (0.5,)  # vitkit's own, the same for every channel
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(tmp_path / "run"), "--data", "digits"]) == 0


def _fake_fashion(folder: Path, n: int = 100) -> None:
    """Fashion-MNIST's IDX files (gzipped), n random 28x28 images per split."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        for kind, array in (("images-idx3", rng.integers(0, 255, (n, 28, 28))),
                            ("labels-idx1", np.arange(n) % 10)):  # fmt: skip
            header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            data = header + array.astype(np.uint8).tobytes()
            (folder / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(data))


@requires_timm
def test_fine_tune_a_timm_rgb_folder_on_fashion_mnist(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    source = timm.create_model("deit_tiny_patch16_224", pretrained=False, **TINY_VIT)
    save_for_hf(source, str(tmp_path / "hub"), safe_serialization=True)
    _fake_fashion(tmp_path / "fm")
    argv = ["--pretrained", str(tmp_path / "hub"), "--data", "fashion-mnist", "--data-dir",
            str(tmp_path / "fm"), "--img-size", "28"]  # fmt: skip
    model = _train(argv, tmp_path / "run", capsys)
    assert model.config.in_chans == 1 and model.data_config.input_size == (1, 28, 28)
    assert model.data_config.mean == pytest.approx((0.449,))  # timm's ImageNet, averaged


@requires_timm
@pytest.mark.parametrize(
    "preset, sizes, img_size",
    [("swin_tiny_patch4_window7_224", TINY_SWIN, 32), ("eva02_tiny_patch14_224", TINY_EVA, 28)],
)
def test_fine_tune_a_timm_rgb_swin_and_eva_on_digits(tmp_path, capsys, preset, sizes, img_size):
    from timm.models._hub import save_for_hf

    source = timm.create_model(preset, pretrained=False, **sizes)
    save_for_hf(source, str(tmp_path / "hub"), model_args=sizes, safe_serialization=True)
    argv = ["--pretrained", str(tmp_path / "hub"), "--data", "digits", "--img-size", str(img_size)]
    model = _train(argv, tmp_path / "run", capsys)
    assert model.config.in_chans == 1 and model.config.num_classes == 10
    assert model.data_config.input_size == (1, img_size, img_size)


def test_converted_channels_are_pillows():
    from PIL import Image

    from vitkit.data.channels import convert_channels

    rgb = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    pillow = np.asarray(Image.fromarray(rgb).convert("L"), dtype=np.float32) / 255
    ours = convert_channels(torch.from_numpy(rgb).permute(2, 0, 1).float() / 255, 1)  # (1, H, W)
    assert ours.shape == (1, 5, 6)
    torch.testing.assert_close(ours[0], torch.from_numpy(pillow), atol=0.5 / 255, rtol=0)
    grey = torch.rand(1, 4, 4)
    assert torch.equal(convert_channels(grey, 3), grey.expand(3, -1, -1))
    assert convert_channels(Image.fromarray(rgb), 1).mode == "L"


def test_in_chans_converts_the_images_instead(tmp_path, capsys, caplog):
    """`--in-chans 3` on grey data: the images are made RGB and the weights stay RGB."""
    source = tmp_path / "rgb.safetensors"
    vitkit.save(_source("vit"), source)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        argv = ["--pretrained", str(source), "--data", "digits", "--in-chans", "3"]
        model = _train(argv, tmp_path / "run", capsys)
    assert "digits images converted to 3 channels" in caplog.messages
    assert not [m for m in caplog.messages if "adapt_input_conv" in m]
    assert model.config.in_chans == 3 and model.data_config.input_size == (3, 16, 16)
