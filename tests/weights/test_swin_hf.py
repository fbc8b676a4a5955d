"""Hugging Face and torchvision Swin weights into vitkit: HF `Swin*` / `Swinv2*` folders and
state dicts (Hub and transformers 5 key names), torchvision `swin_*` / `swin_v2_*` state
dicts and files; outputs equal the source library's within 1e-5 relative on random weights
with non-trivial norms and logit scales, and image sizes where the libraries' windows differ
from timm's are refused in one line."""

from __future__ import annotations

import pytest
import torch
from _parity import randomize_far

import vitkit
from _helpers import optional_import, requires_torchvision, requires_transformers
from vitkit import CheckpointError, SwinTransformer, cli, load_pretrained
from vitkit.weights import inspect, load_any
from vitkit.weights.swin.torchvision import from_torchvision_swin, torchvision_swin_builder

transformers = optional_import("transformers")
tv_swin = optional_import("torchvision.models.swin_transformer")
RTOL = 1e-5
SIZES = dict(embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8])


def _hf(version: int = 1, **options) -> torch.nn.Module:
    config_cls = transformers.SwinConfig if version == 1 else transformers.Swinv2Config
    model_cls = (
        transformers.SwinForImageClassification
        if version == 1
        else transformers.Swinv2ForImageClassification
    )
    config = config_cls(**{**SIZES, "image_size": 64, "patch_size": 2, "window_size": 4,
                            "num_labels": 7, **options})  # fmt: skip
    return randomize_far(model_cls._from_config(config, attn_implementation="eager"))


def _tv(version: int = 1, window: int = 2, patch: int = 4) -> torch.nn.Module:
    extra = {}
    if version == 2:
        extra = dict(block=tv_swin.SwinTransformerBlockV2, downsample_layer=tv_swin.PatchMergingV2)
    model = tv_swin.SwinTransformer(patch_size=[patch, patch], window_size=[window, window],
                                    num_classes=7, **SIZES, **extra)  # fmt: skip
    return randomize_far(model)


def _rel(ours: torch.nn.Module, theirs: torch.nn.Module, size=(64, 64)) -> float:
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours(x), theirs(x)
    b = getattr(b, "logits", b)
    return ((a - b).abs().max() / b.abs().max()).item()


@requires_transformers
def test_hf_swin_folder_loads_with_hfs_logits(tmp_path):
    source = _hf(1)
    source.save_pretrained(tmp_path)
    info = inspect(tmp_path)
    assert info.format == "hf" and info.config.version == 1 and info.config.img_size == 64
    model = load_pretrained(tmp_path)
    assert isinstance(model, SwinTransformer) and model.config.num_heads == (1, 2, 4, 8)
    assert _rel(model, source) < RTOL
    assert _rel(load_any(tmp_path), source) < RTOL


@pytest.mark.slow
@requires_transformers
def test_hf_swinv2_folder_with_pretrained_windows_as_a_bin_file(tmp_path):
    source = _hf(2, pretrained_window_sizes=[8, 8, 8, 2])
    source.save_pretrained(tmp_path)
    from safetensors.torch import load_file  # the Hub names, saved weights-only as a .bin

    torch.save(load_file(tmp_path / "model.safetensors"), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    model = load_pretrained(tmp_path)
    assert model.config.version == 2 and model.config.pretrained_window_sizes == (8, 8, 8, 2)
    assert _rel(model, source) < RTOL


@requires_transformers
def test_hf_state_dicts_in_transformers_5_names_load_with_their_config():
    source = _hf(1)
    assert any(".attention.q_proj." in k for k in source.state_dict())  # the new names
    model = load_pretrained(source.state_dict(), hf_config=source.config)
    assert _rel(model, source) < RTOL


@requires_transformers
def test_hf_swinv2_state_dict_without_config_is_refused_in_one_line():
    with pytest.raises(CheckpointError, match=r"^Hugging Face Swin weights do not record "
                                              r"the image size; pass arch="):  # fmt: skip
        load_pretrained(_hf(2).state_dict())


@pytest.mark.slow
@requires_transformers
def test_hf_non_square_input_under_dynamic_img_size_matches_hf():
    """HF pads before it shifts and timm after; at 64x96 every shifted stage map is whole
    windows, so vitkit's dynamic model gives HF's logits."""
    source = _hf(1)
    model = load_pretrained(source.state_dict(), hf_config=source.config, dynamic_img_size=True)
    assert _rel(model, source, (64, 96)) < RTOL


@requires_transformers
def test_hf_image_size_whose_maps_are_not_whole_windows_is_refused():
    config = {**_hf(1).config.to_dict(), "image_size": [56, 72]}
    with pytest.raises(
        CheckpointError,
        match=r"^at img_size \(56, 72\) stage 2 is a 7x9 map for a window of 4, which Hugging "
        r"Face V1 pads or clamps unlike timm: no faithful copy; load at an img_size whose "
        r"stage maps are whole windows, or pass windows_like='hf' \(its windowing\)$",
    ):
        load_pretrained(_hf(1).state_dict(), hf_config=config)


@requires_transformers
def test_hf_absolute_position_embedding_is_refused():
    source = _hf(1, use_absolute_embeddings=True)
    with pytest.raises(CheckpointError, match=r"absolute position embedding.*timm's and "):
        load_pretrained(source.state_dict(), hf_config=source.config)


@requires_torchvision
@pytest.mark.parametrize("version", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_torchvision_swin_state_dict_loads_with_torchvisions_logits(version):
    source = _tv(version)
    model = load_pretrained(source.state_dict(), img_size=64)
    assert model.config.version == version and model.config.windows == (2, 2, 2, 2)
    assert _rel(model, source) < RTOL


@requires_torchvision
def test_torchvision_swin_file_is_inspected_and_needs_an_image_size(tmp_path):
    torch.save(_tv(2).state_dict(), tmp_path / "swin_v2.pth")
    info = inspect(tmp_path / "swin_v2.pth")
    assert info.format == "torchvision" and info.config is None
    assert str(info.error) == (
        "torchvision Swin weights of sizes no builder (swin_t ... swin_v2_b) has do not record "
        "the image size; pass arch='<timm model name>' or img_size=(h, w)"
    )
    assert load_pretrained(tmp_path / "swin_v2.pth", img_size=128).config.version == 2


@pytest.mark.slow
@requires_torchvision
def test_torchvision_map_padded_by_exactly_the_shift_gives_torchvisions_logits():
    """At 72 the maps are 18, 9, 5, 3 for windows of 2: torchvision pads before the shift and
    timm after, and a padding of one row equal to the shift puts the padding and the wrapped
    row in regions of their own either way."""
    source = _tv(1)
    model = load_pretrained(source.state_dict(), img_size=72)
    assert _rel(model, source, (72, 72)) < RTOL


@requires_torchvision
def test_torchvision_map_smaller_than_its_window_is_refused():
    """torchvision pads a 2x2 map to its 4x4 window and attends to the padding; timm clamps."""
    message = r"^at img_size 64 stage 3 is a 2x2 map for a window of 4, which torchvision pads"
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(_tv(1, window=4).state_dict(), img_size=64)


@pytest.mark.slow
@requires_transformers
def test_hf_folder_processor_gives_the_data_config(tmp_path):
    """A Hub folder's ViTImageProcessor (Swin's: resize both sides, ImageNet statistics)."""
    source = _hf(1)
    source.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(
        size={"height": 64, "width": 64}, resample=3, image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )  # fmt: skip
    processor.save_pretrained(tmp_path)
    data = load_pretrained(tmp_path).data_config
    assert (data.input_size, data.crop_mode, data.interpolation) == (
        (3, 64, 64),
        "squash",
        "bicubic",
    )
    assert data.mean == (0.485, 0.456, 0.406)


@requires_torchvision
@pytest.mark.parametrize("builder", ["swin_t", pytest.param("swin_v2_t", marks=pytest.mark.slow)])
def test_a_torchvision_builder_name_gives_its_image_size(builder):
    """`arch='swin_t'` reads the builder's own weights at 224 (swin_v2_t: 256), checked
    against the sizes the tensors show (on the meta device: no memory)."""
    import torchvision

    with torch.device("meta"):
        weights = getattr(torchvision.models, builder)().state_dict()
    _, config = from_torchvision_swin(weights, arch=builder)
    assert config.img_size == (224 if builder == "swin_t" else 256)
    assert torchvision_swin_builder(config) == builder
    with pytest.raises(CheckpointError, match=r"^the weights are not 'swin_b': they have version"):
        from_torchvision_swin(weights, arch="swin_b")


@pytest.mark.slow
@requires_torchvision
def test_convert_from_torchvision_checks_parity_against_torchvision(tmp_path, capsys):
    torch.save(_tv(2, window=4, patch=8).state_dict(), tmp_path / "tv.pth")
    argv = ["convert", "--from", "torchvision", str(tmp_path / "tv.pth"),
            str(tmp_path / "out.safetensors"), "--arch", "swinv2_tiny_window8_256"]  # fmt: skip
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3] == (
        "converted 102 tensors: embed_dim 32, depths (1, 1, 2, 1), heads (1, 2, 4, 8), windows "
        "(4, 4, 4, 4), patch 8, img_size 256, 7 classes, pool avg"
    )
    assert lines[-1].startswith("parity vs torchvision SwinTransformer: max |difference| ")
    assert lines[-1].endswith("over the logits of a random batch of 2 (ok, tolerance 1e-04)")
    assert vitkit.load(tmp_path / "out.safetensors").config.version == 2


@pytest.mark.slow
@requires_transformers
def test_convert_from_a_hf_folder_checks_parity_against_transformers(tmp_path, capsys):
    _hf(1).save_pretrained(tmp_path / "hf")
    argv = ["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "out.safetensors")]
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("parity vs transformers SwinForImageClassification: max |difference|")
    assert last.endswith("(ok, tolerance 1e-04)")


@pytest.mark.slow
@pytest.mark.requires("timm", extra="interop")
def test_convert_from_timm_checks_a_narrow_swin_against_timms_model_of_its_sizes(tmp_path, capsys):
    import timm

    name = "swin_tiny_patch4_window7_224"
    source = timm.create_model(name, embed_dim=32, num_heads=(1, 2, 4, 8), depths=(1, 1, 2, 1))
    torch.save(source.state_dict(), tmp_path / "swin.pth")
    argv = ["convert", "--from", "timm", str(tmp_path / "swin.pth"),
            str(tmp_path / "out.safetensors"), "--arch", name]  # fmt: skip
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"parity vs timm {name} (embed_dim=32, depths=(1, 1, 2, 1), ")
    assert last.endswith("(ok, tolerance 1e-04)")


@requires_transformers
def test_hf_swinv2_of_three_stages_with_transformers_default_pretrained_windows(tmp_path):
    """transformers' Swinv2Config defaults pretrained_window_sizes to four zeros and reads
    entry i for stage i, so a 3-stage folder carries one entry too many: the first three
    count, as in transformers."""
    three = dict(embed_dim=32, depths=[1, 1, 2], num_heads=[1, 2, 4])
    source = _hf(2, **three)
    assert list(source.config.pretrained_window_sizes) == [0, 0, 0, 0]
    source.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)
    assert model.config.depths == (1, 1, 2) and model.config.pretrained_window_sizes == (0, 0, 0)
    assert _rel(model, source) < RTOL
