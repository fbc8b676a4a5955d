"""timm's Swin weights into vitkit: a state dict, a file and a Hub folder, told from a ViT's by
their keys; what the weights show read from them, what they do not from arch= (or refused in
one line). Outputs equal timm's within 1e-5 relative."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, perturb, relative_error, requires_timm
from vitkit import CheckpointError, SwinTransformer, load_pretrained
from vitkit.weights import inspect, load_any
from vitkit.weights.swin.timm import timm_swin_layout

timm = optional_import("timm")
RTOL = 1e-5
NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(1, 1, 2, 1))


def _timm(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb(timm.create_model(name, pretrained=False, **NARROW, **options))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: tuple[int, int]) -> None:
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) < RTOL


@requires_timm
def test_a_v1_state_dict_loads_with_its_arch_and_timms_outputs():
    source = _timm("swin_tiny_patch4_window7_224")
    model = load_pretrained(source.state_dict(), arch="swin_tiny_patch4_window7_224")
    assert isinstance(model, SwinTransformer) and not model.training
    assert model.config.depths == (1, 1, 2, 1) and model.config.num_heads == (1, 2, 4, 8)
    assert model.data_config.mean == (0.485, 0.456, 0.406)
    _same(model, source, (224, 224))


@requires_timm
def test_v1_weights_show_their_windows_but_not_the_image_size():
    source = _timm("swin_tiny_patch4_window7_224")
    with pytest.raises(
        CheckpointError,
        match=r"^Swin V1 weights do not record the image size; pass arch='<timm model name>' "
        r"or img_size=\(h, w\)$",
    ):
        load_pretrained(source.state_dict())
    model = load_pretrained(source.state_dict(), img_size=224)  # windows from the tables
    assert model.config.window_size == (7, 7, 7, 7)
    _same(model, source, (224, 224))


@requires_timm
def test_v2_needs_its_windows_and_reads_the_rest():
    options = dict(img_size=256, pretrained_window_sizes=(12, 12, 12, 6))
    source = _timm("swinv2_small_window16_256", **options)
    with pytest.raises(CheckpointError, match="^Swin V2 weights do not record the image size "):
        load_pretrained(source.state_dict())
    model = load_pretrained(source.state_dict(), window_size=16, **options)
    assert model.config.version == 2
    _same(model, source, (256, 256))
    with pytest.raises(
        CheckpointError, match=r"version 2 \(swin_tiny_patch4_window7_224: version 1\)"
    ):
        load_pretrained(source.state_dict(), arch="swin_tiny_patch4_window7_224")


@requires_timm
def test_a_new_head_and_the_original_microsoft_layout():
    source = _timm("swin_tiny_patch4_window7_224")
    model = load_pretrained(source.state_dict(), arch="swin_tiny_patch4_window7_224",
                            num_classes=3)  # fmt: skip
    assert model.head.fc.out_features == 3
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), source.forward_features(x))
    # the original checkpoints merge patches at the end of a stage and name the head `head`
    original = {}
    for key, value in source.state_dict().items():
        for stage in (1, 2, 3):
            key = key.replace(f"layers.{stage}.downsample", f"layers.{stage - 1}.downsample")
        original[key.replace("head.fc.", "head.")] = value
    assert timm_swin_layout(original).keys() == source.state_dict().keys()
    _same(load_pretrained(original, arch="swin_tiny_patch4_window7_224"), source, (224, 224))


@requires_timm
def test_a_hub_folder_and_a_file(tmp_path):
    from timm.models._hub import save_for_hf

    source = _timm("swinv2_tiny_window8_256")
    save_for_hf(source, str(tmp_path / "hub"), safe_serialization=True)
    info = inspect(tmp_path / "hub")
    assert info.format == "timm" and info.config.version == 2 and info.config.window_size == 8
    _same(load_any(tmp_path / "hub"), source, (256, 256))
    torch.save(source.state_dict(), tmp_path / "swin.pth")
    with pytest.raises(CheckpointError, match="pass arch='<timm model name>'"):
        load_any(tmp_path / "swin.pth")
    _same(load_any(tmp_path / "swin.pth", arch="swinv2_tiny_window8_256"), source, (256, 256))


@requires_timm
def test_vit_weights_still_load_as_vits():
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1).eval()
    model = load_pretrained(vit.state_dict(), num_heads=3)
    assert type(model).__name__ == "VisionTransformer"


@requires_timm
def test_fine_tuning_at_another_size_resizes_the_tables_as_timm():
    """Weights of a 224 model run at 56: the maps shrink to 14, 7, 4, 2, so the windows of
    stages 2 and 3 clamp to 4 and 2 and their tables are resized, as timm's
    `checkpoint_filter_fn` does when its model is built at 56."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    source = _timm("swin_tiny_patch4_window7_224")
    model = load_pretrained(source.state_dict(), arch="swin_tiny_patch4_window7_224",
                            img_size=56)  # fmt: skip
    theirs = timm.create_model("swin_tiny_patch4_window7_224", img_size=56, **NARROW).eval()
    theirs.load_state_dict(checkpoint_filter_fn(source.state_dict(), theirs))
    assert model.layers[3].blocks[0].attn.relative_position_bias_table.shape == (9, 8)
    _same(model, theirs, (56, 56))


@requires_timm
def test_a_saved_swin_loads_with_its_config(tmp_path):
    import vitkit

    source = _timm("swinv2_tiny_window8_256")
    model = load_pretrained(source.state_dict(), arch="swinv2_tiny_window8_256")
    vitkit.save(model, tmp_path / "swin.safetensors", meta={"class_names": None})
    loaded = vitkit.load(tmp_path / "swin.safetensors")
    assert isinstance(loaded, SwinTransformer) and loaded.config == model.config
    assert loaded.data_config == model.data_config
    _same(loaded, source, (256, 256))
    assert inspect(tmp_path / "swin.safetensors").format == "vitkit"


@requires_timm
def test_a_saved_swin_whose_config_was_edited_is_refused(tmp_path):
    import json

    from safetensors.torch import load_file, safe_open, save_file

    import vitkit

    model = vitkit.create_model("swin_tiny_patch4_window7_224", **NARROW, img_size=64)
    vitkit.save(model, tmp_path / "a.safetensors")
    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as f:
        metadata = f.metadata()
    config = json.loads(metadata["vitkit_config"])
    config["depths"] = [1, 1, 3, 1]
    metadata["vitkit_config"] = json.dumps(config)
    save_file(load_file(tmp_path / "a.safetensors"), tmp_path / "b.safetensors", metadata)
    with pytest.raises(CheckpointError, match="its config does not match its tensors"):
        vitkit.load(tmp_path / "b.safetensors")
