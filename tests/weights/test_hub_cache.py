"""Hub ids as weights, read from the local Hugging Face cache (weights/hub_cache.py): a cache
made in a temporary HF_HOME in the layout huggingface_hub writes (`models--ORG--NAME/refs/main`,
`snapshots/<commit>/...`), read offline by `vitkit train --pretrained timm/NAME`, by the
library, and by timm itself from the same cache."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import CheckpointError, cli
from vitkit.weights.hub_cache import resolve_weights

timm = optional_import("timm")
pytest.importorskip("huggingface_hub", reason="huggingface_hub not installed")

NAME = "vit_tiny_patch16_224.tiny_test"
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=5)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_timm_model(home: Path, repo: str = f"timm/{NAME}") -> torch.nn.Module:
    """A tiny timm ViT of random weights, saved as a timm Hub folder in the cache at `home`."""
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    model = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY))
    storage = home / "hub" / ("models--" + repo.replace("/", "--"))
    save_for_hf(model, str(storage / "snapshots" / COMMIT), model_args=TINY,
                safe_serialization=True)  # fmt: skip
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(COMMIT)
    return model


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty cache at a temporary HF_HOME, offline; huggingface_hub's constants (read at its
    import) pointed at it too, for timm."""
    import huggingface_hub.constants as constants

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


@requires_timm
def test_a_timm_id_in_the_cache_loads_as_timm_loads_it(hf_home):
    _cache_timm_model(hf_home)
    theirs = timm.create_model(f"hf-hub:timm/{NAME}", pretrained=True).eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(x)
        for source in (f"timm/{NAME}", f"hf-hub:timm/{NAME}", f"hf-hub:timm/{NAME}@main"):
            ours = vitkit.load_pretrained(source)
            torch.testing.assert_close(ours(x), expected, atol=1e-6, rtol=0)
    folder = hf_home / "hub" / f"models--timm--{NAME}" / "snapshots" / COMMIT
    assert resolve_weights(f"timm/{NAME}") == folder
    assert resolve_weights(f"local-dir:{folder}") == folder


@requires_timm
def test_train_pretrained_timm_id_offline_then_predict_with_it(hf_home, tmp_path, capsys):
    _cache_timm_model(hf_home)
    run = tmp_path / "run"
    argv = ["train", "--pretrained", f"timm/{NAME}", "--data", "digits", "--epochs", "1",
            "--train-limit", "64", "--batch-size", "32", "--out", str(run),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(run / "model.safetensors")
    assert model.config.num_classes == 10 and model.config.in_chans == 1  # grey digits
    image = tmp_path / "x.png"
    Image.fromarray(np.full((16, 16, 3), 128, dtype=np.uint8)).save(image)
    capsys.readouterr()
    # the cached model's own 5 classes, by their indices
    assert cli.main(["predict", "--checkpoint", f"timm/{NAME}", "--topk", "1", str(image)]) == 0
    assert capsys.readouterr().out.startswith(f"{image}: ")


def test_an_id_not_in_the_cache_is_one_line(hf_home, tmp_path, capsys):
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(image)
    for given, message in (
        (f"timm/{NAME}", f"timm/{NAME} is not in the Hugging Face cache (HF_HOME={hf_home}); "
                         f"get it with: hf download timm/{NAME}"),
        ("hf-hub:org/name@v2", f"org/name@v2 is not in the Hugging Face cache (HF_HOME="
                               f"{hf_home}); get it with: hf download org/name --revision v2"),
        ("google/vit-x", f"google/vit-x is no file or folder, and not in the Hugging Face cache "
                         f"(HF_HOME={hf_home}); get it with: hf download google/vit-x"),
    ):  # fmt: skip
        assert cli.main(["predict", "--checkpoint", given, str(image)]) == 2
        err = capsys.readouterr().err
        assert err == f"vitkit: error: {message}\n", err


def test_the_cache_named_by_hf_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(CheckpointError, match=rf"\(HF_HUB_CACHE={tmp_path}/elsewhere\); get it"):
        resolve_weights("timm/absent")


def test_a_path_that_exists_is_a_path(tmp_path, monkeypatch):
    """`runs/x` that exists is that folder, whatever the cache holds; a file name is never an
    id; without huggingface_hub an id names the extra that brings it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    assert resolve_weights("runs/x") == Path("runs/x")
    assert resolve_weights("runs/y.safetensors") == Path("runs/y.safetensors")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CheckpointError, match=r"needs huggingface_hub: pip install 'vitkit\["):
        resolve_weights("timm/absent")


@requires_timm
def test_convert_a_timm_id_checks_parity_against_timm(hf_home, tmp_path, capsys):
    _cache_timm_model(hf_home)
    out = tmp_path / "converted.safetensors"
    assert cli.main(["convert", "--from", "timm", f"timm/{NAME}", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"converting timm/{NAME} (timm weights) ...\n"), printed
    assert "parity" in printed and vitkit.load(out).config.embed_dim == 32


@pytest.mark.slow  # transformers' import
def test_a_hugging_face_id_in_the_cache_loads_as_transformers_loads_it(hf_home):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, image_size=16, patch_size=4,
                                    num_labels=3)  # fmt: skip
    torch.manual_seed(0)
    source = randomize(transformers.ViTForImageClassification(config))
    storage = hf_home / "hub" / "models--google--vit-tiny-test"
    source.save_pretrained(storage / "snapshots" / COMMIT)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(COMMIT)
    theirs = transformers.ViTForImageClassification.from_pretrained("google/vit-tiny-test")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = vitkit.load_pretrained("google/vit-tiny-test")(x)
        torch.testing.assert_close(ours, theirs.eval()(pixel_values=x).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "source, message",
    [
        ("timm/", "'timm/' is not a Hub id: give timm/NAME (letters, digits, '-', '_' and '.', no "
                  "'..' or '--'), e.g. timm/vit_base_patch16_224.augreg_in21k"),
        ("hf-hub:", "'hf-hub:' is not a Hub id: give hf-hub:ORG/NAME (letters, digits, '-', '_' "
                    "and '.', no '..' or '--'), e.g. "
                    "hf-hub:timm/vit_base_patch16_224.augreg_in21k"),
        ("hf-hub:org/..name", "'hf-hub:org/..name' is not a Hub id: give hf-hub:ORG/NAME"),
        ("timm/../etc", "'timm/../etc' is not a Hub id: give timm/NAME"),
        ("local-dir:", "local-dir: names no folder; give local-dir:PATH"),
    ],
)  # fmt: skip
def test_an_id_that_names_nothing_is_one_line(hf_home, tmp_path, monkeypatch, source, message):
    monkeypatch.chdir(tmp_path)  # local-dir: read the working folder as the weights
    with pytest.raises(CheckpointError) as caught:
        resolve_weights(source)
    assert str(caught.value) == message or str(caught.value).startswith(message + " (")


def test_an_hf_home_that_is_a_file_is_named(tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    home.write_text("not a folder")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    with pytest.raises(CheckpointError) as caught:
        resolve_weights(f"timm/{NAME}")
    assert str(caught.value) == (
        f"the Hugging Face cache {home}/hub (HF_HOME={home}) cannot be a folder: {home} is a "
        "file; point HF_HOME (or HF_HUB_CACHE) at a folder, or unset it"
    )
