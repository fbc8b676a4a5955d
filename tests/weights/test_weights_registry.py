"""The weights registry (`weights/families.py`): every model family's weights are served by one
record, which the generic code asks for the keys, the converter and the checks of a family."""

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

import vitkit
from vitkit.model import architectures, create_model
from vitkit.weights.checkpoint import ARCH_KEY
from vitkit.weights.detect import CONVERTERS, detect_format
from vitkit.weights.families import (
    WeightsFamily,
    reader,
    reading_family,
    register,
    weights_family,
)

TINY_SWIN = dict(embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4, img_size=32)


@pytest.mark.parametrize("arch", architectures(), ids=lambda a: a.name)
def test_every_architecture_has_one_weights_family(arch):
    config = next(iter(arch.presets.values()))
    assert arch.name in weights_family(config).architectures


@pytest.mark.parametrize("arch", architectures(), ids=lambda a: a.name)
def test_a_family_recognises_the_keys_of_every_format_it_reads(arch):
    family = weights_family(next(iter(arch.presets.values())))
    assert set(family.readers) <= set(family.recognises)


def test_an_architecture_is_served_once():
    with pytest.raises(ValueError, match="registered"):
        register(WeightsFamily(architectures=("vit",), recognises={}, readers={}, fill=print))


def test_one_converter_per_format_reads_the_family_its_keys_are():
    swin = create_model("swin_tiny_patch4_window7_224", **TINY_SWIN).state_dict()
    vit = create_model("vit_tiny_patch16_224", depth=1, img_size=32).state_dict()
    assert detect_format(swin) == detect_format(vit) == "timm"
    assert reading_family("timm", list(swin)).architectures == ("swin", "swin_cr")
    assert reading_family("timm", list(vit)).architectures == ("vit",)
    assert CONVERTERS["timm"] is reader("timm")
    _, config = CONVERTERS["timm"](swin, img_size=32, window_size=4)
    assert config.depths == (1, 1)


@pytest.mark.parametrize(
    "name, options",
    [
        ("vit_tiny_patch16_224", dict(depth=1, img_size=32)),
        ("swin_tiny_patch4_window7_224", TINY_SWIN),
    ],
)
def test_a_checkpoint_records_its_architecture(tmp_path, name, options):
    model = create_model(name, **options)
    vitkit.save(model, tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        recorded = f.metadata()[ARCH_KEY]
    assert recorded == weights_family(model.config).architectures[0]
    assert type(vitkit.load(tmp_path / "m.safetensors")) is type(model)


def test_a_checkpoint_without_its_architecture_is_a_vit(tmp_path):
    """Files written before every family recorded its architecture hold ViTs."""
    path = tmp_path / "m.safetensors"
    model = create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    vitkit.save(model, path)
    with safe_open(str(path), framework="pt") as f:
        metadata = {k: v for k, v in f.metadata().items() if k != ARCH_KEY}
    save_file(load_file(str(path)), str(path), metadata=metadata)
    loaded = vitkit.load(path)
    assert torch.equal(loaded.state_dict()["pos_embed"], model.state_dict()["pos_embed"])
