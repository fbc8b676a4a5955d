"""timm's Swin V2-cr weights into vitkit: a state dict (also its original `tau` / `head.`
layout), a file and a Hub folder, told by their keys; sizes, heads and extra norms read from
the tensors, the image size from arch= or img_size (or refused in one line); a saved cr model
loads with its config; `vitkit train --pretrained` fine-tunes one. Outputs equal timm's within
1e-5 relative."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, perturb, relative_error, requires_timm
from vitkit import CheckpointError, cli, load, load_pretrained, save
from vitkit.model import SwinCrConfig, SwinTransformerV2Cr
from vitkit.weights import inspect, load_any
from vitkit.weights.checkpoint import ArchMismatchError

timm = optional_import("timm")
RTOL = 1e-5
NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(2, 1, 2, 1))


def _timm(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb(timm.create_model(name, pretrained=False, **{**NARROW, **options}))


def _same(ours: torch.nn.Module, theirs: torch.nn.Module, size: tuple[int, int]) -> None:
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(ours(x), theirs(x)) < RTOL


@requires_timm
def test_a_state_dict_shows_its_sizes_and_norms_not_its_image_size():
    source = _timm("swinv2_cr_small_ns_256", img_size=64)
    sd = source.state_dict()
    model = load_pretrained(sd, img_size=64)
    assert isinstance(model, SwinTransformerV2Cr)
    config = model.config
    assert (config.depths, config.num_heads, config.embed_dim) == (NARROW["depths"],
            NARROW["num_heads"], 32)  # fmt: skip
    assert config.extra_norm_stage and config.extra_norm_period == 0
    _same(model, source, (64, 64))
    with pytest.raises(CheckpointError) as err:
        load_pretrained(sd)
    assert str(err.value) == (
        "Swin V2-cr weights do not record the image size; pass arch='<timm model name>' or "
        "img_size=(h, w)"
    )
    named = load_pretrained(sd, arch="swinv2_cr_small_ns_256", img_size=64)
    assert named.config.img_size == 64 and named.config.stage_windows[0] == (2, 2)
    wider = load_pretrained(sd, img_size=64, window_ratio=4)  # cr's own options pass through
    assert wider.stages[0].blocks[0].window_size == (4, 4)
    with pytest.raises(ArchMismatchError, match="they have timm's Swin V2-cr keys"):
        load_pretrained(sd, arch="swinv2_tiny_window8_256")


@requires_timm
def test_periodic_norms_the_original_layout_and_other_swins():
    source = _timm("swinv2_cr_huge_224", depths=(1, 1, 5, 1), img_size=64, extra_norm_period=2)
    sd = source.state_dict()
    old = {}  # the layout of the original files: tau = 1 / exp(logit_scale), `head.`
    for key, value in sd.items():
        if key.endswith("logit_scale"):
            key, value = key.replace("logit_scale", "tau"), 1 / value.exp()
        old[key.replace("head.fc.", "head.")] = value
    model = load_pretrained(old, arch="swinv2_cr_huge_224", img_size=64)
    assert model.config.extra_norm_period == 2 and not model.config.extra_norm_stage
    _same(model, source, (64, 64))
    v2 = timm.create_model("swinv2_tiny_window8_256", **NARROW, img_size=64)
    with pytest.raises(ArchMismatchError, match="V1 / V2 keys .layers.N...., not V2-cr's"):
        load_pretrained(v2.state_dict(), arch="swinv2_cr_tiny_224")


@requires_timm
def test_a_hub_folder_a_file_and_a_saved_model(tmp_path):
    from timm.models._hub import save_for_hf

    source = _timm("swinv2_cr_tiny_ns_224", img_size=64)
    save_for_hf(source, str(tmp_path / "hub"), safe_serialization=True)
    info = inspect(tmp_path / "hub")  # config.json names the architecture and its img_size
    assert info.format == "timm" and isinstance(info.config, SwinCrConfig)
    assert info.config.extra_norm_stage and info.config.img_size == (64, 64)
    model = load_any(tmp_path / "hub")
    _same(model, source, (64, 64))
    torch.save(source.state_dict(), tmp_path / "cr.pth")
    with pytest.raises(CheckpointError, match="do not record the image size"):
        load_any(tmp_path / "cr.pth")
    save(model, tmp_path / "cr.safetensors")
    again = load(tmp_path / "cr.safetensors")
    assert isinstance(again, SwinTransformerV2Cr) and again.config == model.config
    _same(again, source, (64, 64))


@requires_timm
@pytest.mark.slow
def test_fine_tune_a_timm_cr_hub_folder(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    source = timm.create_model("swinv2_cr_tiny_ns_224", in_chans=1, **NARROW)
    save_for_hf(source, str(tmp_path / "hub"), safe_serialization=True)
    run = tmp_path / "run"
    argv = ["train", "--pretrained", str(tmp_path / "hub"), "--img-size", "64", "--data",
            "digits", "--epochs", "1", "--train-limit", "32", "--batch-size", "32", "--out",
            str(run), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = load(run / "model.safetensors")
    assert isinstance(model, SwinTransformerV2Cr) and model.config.num_classes == 10
    assert model.patch_embed.img_size == (64, 64) and model.config.extra_norm_stage
    # windows are the grid / 8 at the new size, as timm's set_input_size keeps them
    assert model.stages[0].blocks[0].window_size == (2, 2)
