"""`vitkit train --pretrained SOURCE` for every format `load_pretrained` reads: the architecture
comes from the weights, the head is replaced for the data's classes, the position grid is
resampled to `--img-size`, and the weights' data config is the run's; a config-less file with
a non-standard width needs the head count given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from _helpers import write_jax_npz
from vitkit import cli

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pets")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (root / name).mkdir()
        for i in range(8):
            pixels = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def _vitkit(path: Path) -> Path:
    torch.manual_seed(0)
    vitkit.save(vitkit.VisionTransformer(**SMALL), path / "m.safetensors")
    return path / "m.safetensors"


def _timm_hub(path: Path) -> Path:
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    model = timm.create_model(
        "deit_tiny_patch16_224.fb_in1k", pretrained=False, depth=2, img_size=32, patch_size=8
    )
    save_for_hf(model, str(path / "hub"), safe_serialization=True)
    return path / "hub"


def _timm_file(path: Path) -> Path:
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_tiny_patch16_224", depth=2, img_size=32, patch_size=8)
    torch.save(model.state_dict(), path / "timm.pth")
    return path / "timm.pth"


def _hf_folder(path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    transformers.ViTForImageClassification(config).save_pretrained(path / "hf")
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path / "hf")
    return path / "hf"


def _torchvision_file(path: Path) -> Path:
    pytest.importorskip("torchvision")
    from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

    model = TorchvisionViT(
        image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=384
    )
    torch.save(model.state_dict(), path / "tv.pth")
    return path / "tv.pth"


def _jax_file(path: Path) -> Path:
    torch.manual_seed(0)
    write_jax_npz(vitkit.VisionTransformer(**SMALL), path / "vit.npz")
    return path / "vit.npz"


SOURCES = {
    "vitkit": (_vitkit, 64, 4, (0.5, 0.5, 0.5)),
    "timm-hub": (_timm_hub, 192, 3, (0.485, 0.456, 0.406)),  # DeiT's pretrained_cfg
    "timm-file": (_timm_file, 192, 3, (0.5, 0.5, 0.5)),
    "hf": (_hf_folder, 64, 4, (0.5, 0.5, 0.5)),
    "torchvision": (_torchvision_file, 192, 3, (0.485, 0.456, 0.406)),
    "jax": (_jax_file, 64, 4, (0.5, 0.5, 0.5)),
}


@pytest.mark.parametrize("kind", SOURCES)
def test_fine_tune_from_every_format(tmp_path, folder, kind, capsys):
    make, width, heads, mean = SOURCES[kind]
    source = make(tmp_path)
    out = tmp_path / "run"
    argv = ["train", "--pretrained", str(source), "--data", str(folder), "--img-size", "48"]
    argv += ["--epochs", "1", "--batch-size", "8", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(out / "model.safetensors")
    config = model.config
    assert (config.embed_dim, config.depth, config.num_heads) == (width, 2, heads)
    assert (config.num_classes, model.patch_embed.img_size) == (3, (48, 48))
    assert model.pos_embed.shape == (1, 1 + 6 * 6, width)  # 4x4 grid resampled to 6x6
    assert model.meta["class_names"] == ["cat", "dog", "eel"]
    assert model.data_config.input_size == (3, 48, 48) and model.data_config.mean == mean


def test_a_config_less_file_of_a_non_standard_width_needs_the_head_count(tmp_path, folder, capsys):
    torch.manual_seed(0)
    torch.save(vitkit.VisionTransformer(**SMALL).state_dict(), tmp_path / "w.pth")
    argv = ["train", "--pretrained", str(tmp_path / "w.pth"), "--data", str(folder)]
    argv += ["--epochs", "1", "--out", str(tmp_path / "run"), "--no-progress"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.endswith("; pass --model-opt num_heads=N\n")
    with pytest.raises(vitkit.CheckpointError, match=r"; pass num_heads=N$"):
        cli.main(["--debug", *argv])
    argv[-2] = str(tmp_path / "run2")
    assert cli.main([*argv, "--model-opt", "num_heads=4"]) == 0
    assert vitkit.load(tmp_path / "run2" / "model.safetensors").config.num_heads == 4


def test_fine_tune_at_another_patch_size_and_with_hf_resampling(tmp_path, folder, capsys):
    source = _timm_file(tmp_path)  # patch 8 at 32: a 4x4 grid
    out = tmp_path / "run"
    argv = ["train", "--pretrained", str(source), "--data", str(folder), "--img-size", "64"]
    argv += ["--model-opt", "patch_size=16", "--pos-resample", "hf", "--epochs", "1"]
    assert cli.main([*argv, "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    model = vitkit.load(out / "model.safetensors")
    assert model.patch_embed.proj.weight.shape == (192, 3, 16, 16)  # PI-resized from 8x8
    assert model.pos_embed.shape == (1, 1 + 4 * 4, 192)
