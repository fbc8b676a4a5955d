"""Hugging Face VitDet weights: transformers' `VitDetModel` / `VitDetBackbone` run beside the
converted vitkit model on the same input, the maps equal within `TOL` (1e-5 absolute plus 1e-5
relative) at the pretraining size, the detection size and non-square sizes; window and global
blocks as HF's; what is refused, in one line."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from _helpers import optional_import, requires_transformers
from vitkit import CheckpointError
from vitkit.model import SimpleFeaturePyramid, VisionTransformer
from vitkit.weights.detect import detect_format
from vitkit.weights.vit.hf_families import hf_family
from vitkit.weights.vit.vitdet import from_hf_vitdet

transformers = optional_import("transformers")
pytestmark = requires_transformers

SMALL = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, patch_size=8,
             pretrain_image_size=32, image_size=64)  # fmt: skip
VARIANTS = {
    # ViTDet's scheme: windows (not dividing the grid: padded), global blocks, relative positions
    "windows_rel_pos": dict(
        window_size=3, window_block_indices=[0, 2], use_relative_position_embeddings=True
    ),  # fmt: skip
    "windows": dict(window_size=2, window_block_indices=[0, 1, 3]),
    "global_rel_pos": dict(use_relative_position_embeddings=True),
    "plain": dict(image_size=32),
}


def hf_model(variant, cls="VitDetModel", **options):
    config = transformers.VitDetConfig(**{**SMALL, **VARIANTS[variant], **options})
    torch.manual_seed(0)
    return randomize(getattr(transformers, cls)(config)).eval()


def convert(hf):
    sd, config = from_hf_vitdet(hf.state_dict(), config=hf.config)
    model = VisionTransformer(config).eval()
    model.load_state_dict(sd)
    return model


def last_map(model, x):
    return model.forward_intermediates(x, [-1], intermediates_only=True)[0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("size", [32, 64, (40, 72)])
def test_vitdet_model_maps_equal_hf(variant, size):
    hf = hf_model(variant)
    model = convert(hf)
    x = images(size, batch=2)
    with torch.no_grad():
        expected = hf(x).last_hidden_state  # (B, D, H/8, W/8)
        torch.testing.assert_close(last_map(model, x), expected, **TOL)


def test_backbone_feature_maps_equal_hf_with_the_same_blocks():
    hf = hf_model("windows_rel_pos", cls="VitDetBackbone", out_indices=[2, 4])
    model = convert(hf)
    hf_windows = [layer.window_size for layer in hf.encoder.layer]
    assert [block.window_size for block in model.blocks] == hf_windows == [3, 0, 3, 0]
    assert model.config.global_blocks == (1, 3) and model.config.rel_pos_img_size == 64
    x = images((48, 80), batch=2)
    with torch.no_grad():
        expected = hf(x).feature_maps
        ours = model.forward_intermediates(x, [1, 3], intermediates_only=True)
    for theirs, mine in zip(expected, ours, strict=True):
        torch.testing.assert_close(mine, theirs, **TOL)


def test_save_pretrained_folder_loads_through_load_pretrained(tmp_path):
    hf = hf_model("windows_rel_pos")
    hf.save_pretrained(tmp_path)
    model = vitkit.load_pretrained(tmp_path).eval()
    x = images((56, 40))
    with torch.no_grad():
        torch.testing.assert_close(last_map(model, x), hf(x).last_hidden_state, **TOL)
    assert detect_format(hf.state_dict()) == "hf" and hf_family(hf.state_dict()) == "vitdet"


def test_vitkit_checkpoint_round_trip_keeps_window_and_global_tables(tmp_path):
    model = convert(hf_model("windows_rel_pos"))
    vitkit.save(model, tmp_path / "vitdet.safetensors")
    loaded = vitkit.load(tmp_path / "vitdet.safetensors").eval()
    assert loaded.config == model.config
    x = images(40)
    with torch.no_grad():
        torch.testing.assert_close(last_map(loaded, x), last_map(model, x), rtol=0, atol=0)


def test_without_a_config_the_options_come_from_the_weights_and_overrides():
    hf = hf_model("windows_rel_pos")
    sd, config = from_hf_vitdet(hf.state_dict(), num_heads=2, window_size=3, global_blocks=(1, 3))
    assert config == convert(hf).config  # the global tables' size read off their shape


def test_pyramid_on_converted_weights():
    model = convert(hf_model("windows_rel_pos"))
    fpn = SimpleFeaturePyramid(model, out_channels=8).eval()
    with torch.no_grad():
        maps = fpn(images((64, 96)))
    assert [tuple(m.shape[-2:]) for m in maps.values()] == [(32, 48), (16, 24), (8, 12),
                                                           (4, 6), (2, 3)]  # fmt: skip


def test_residual_blocks_are_refused_by_name():
    hf = hf_model("windows", residual_block_indices=[1])
    with pytest.raises(CheckpointError, match=r"residual bottleneck blocks after blocks 1"):
        from_hf_vitdet(hf.state_dict(), config=hf.config)


def test_other_activations_are_refused():
    hf = hf_model("plain", hidden_act="gelu_new")
    with pytest.raises(CheckpointError, match="hidden_act='gelu_new'"):
        from_hf_vitdet(hf.state_dict(), config=hf.config)
