"""`weights.inspect`: one look at a file or folder says what it is (format, config, data
config, class names, shapes, or why the config cannot be told), reading headers only, and the
loaders act on that answer: a file is inspected once per load."""

from __future__ import annotations

import json

import pytest
import torch
from _parity import randomize

import vitkit
from _helpers import write_jax_npz
from vitkit.data.data_config import IMAGENET_MEAN, DataConfig
from vitkit.weights import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    inspect,
    load_any,
)
from vitkit.weights import info as info_module
from vitkit.weights.vit.folders import save_hf_folder, save_timm_folder

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=3)
NAMES = ["cat", "dog", "eel"]


def _model(**options) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    model = randomize(vitkit.VisionTransformer(**{**SMALL, **options}))
    model.meta = {"class_names": NAMES}
    model.data_config = DataConfig(input_size=(3, 32, 32), mean=IMAGENET_MEAN, std=0.25)
    return model


def test_a_vitkit_checkpoint(tmp_path):
    model = _model()
    vitkit.save(model, tmp_path / "m.safetensors", meta={"class_names": NAMES})
    info = inspect(tmp_path / "m.safetensors")
    assert (info.format, info.kind, info.folder) == ("vitkit", "a vitkit checkpoint", None)
    assert info.config == model.config and info.class_names == tuple(NAMES)
    assert info.data_config == model.data_config and info.num_classes == 3
    assert info.shapes == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert info.error is None and info.tensors is None  # the header only


def test_a_state_dict_is_mapped_not_read_and_its_config_inferred(tmp_path, monkeypatch):
    model = _model()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    real, calls = torch.load, []
    monkeypatch.setattr(torch, "load", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    info = inspect(tmp_path / "w.pth", num_heads=4)
    assert [(kw["mmap"], kw["weights_only"]) for kw in calls] == [(True, True)]
    assert (info.format, info.kind) == ("timm", "a timm state dict (.pth)")
    assert info.config == model.config.replace(patch_size=8)
    assert info.data_config is None and info.class_names is None
    assert info.tensors.keys() == model.state_dict().keys()  # kept for the loader


def test_why_the_config_cannot_be_told(tmp_path):
    torch.save(_model().state_dict(), tmp_path / "w.pth")
    info = inspect(tmp_path / "w.pth")  # width 64: no standard head count
    assert info.config is None and isinstance(info.error, MissingOptionError)
    assert info.error.option == "num_heads" and info.num_classes is None
    with pytest.raises(MissingOptionError, match=r"width 64 is not a standard ViT size"):
        info.require_config()


def test_the_folders_vitkit_exports(tmp_path):
    pytest.importorskip("transformers")
    model = _model()
    save_hf_folder(model, tmp_path / "hf")
    save_timm_folder(model, tmp_path / "timm")
    hf, timm = inspect(tmp_path / "hf"), inspect(tmp_path / "timm")
    assert (hf.kind, timm.kind) == ("a Hugging Face folder", "a timm folder")
    assert hf.weights_file == tmp_path / "hf" / "model.safetensors"
    for found in (hf, timm):
        assert found.config.embed_dim == 64 and found.config.num_heads == 4
        assert found.class_names == tuple(NAMES)
        assert found.data_config.mean == IMAGENET_MEAN and found.data_config.std == (0.25,) * 3


def test_torchvision_jax_and_cnn_files(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    tv = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                              num_heads=4, hidden_dim=64, mlp_dim=128)  # fmt: skip
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    found = inspect(tmp_path / "tv.pth", num_heads=4)
    assert (found.format, found.config.depth, found.num_classes) == ("torchvision", 2, 1000)
    write_jax_npz(_model(), tmp_path / "j.npz")
    found = inspect(tmp_path / "j.npz")
    assert (found.format, found.kind) == ("jax", "a JAX .npz checkpoint")
    assert found.shapes["embedding/kernel"] == (8, 8, 3, 64) and found.config.num_heads == 4
    cnn = timm.create_model("resnet18", pretrained=False, num_classes=5)
    save_for_hf(cnn.eval(), str(tmp_path / "resnet"), safe_serialization=True)
    found = inspect(tmp_path / "resnet")
    assert (found.format, found.kind) == ("timm-cnn", "a timm folder of the timm CNN resnet18")
    assert found.num_classes == 5 and found.config is None
    loaded = load_any(found)
    assert isinstance(loaded, timm.models.ResNet) and loaded.data_config.input_size == (3, 224, 224)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), cnn(x))


def test_an_onnx_model(tmp_path):
    pytest.importorskip("onnxscript")
    model = _model()
    vitkit.export_onnx(model, tmp_path / "m.onnx")
    found = inspect(tmp_path / "m.onnx")
    assert (found.format, found.kind) == ("onnx", "an ONNX model")
    assert found.data_config == model.data_config
    with pytest.raises(CheckpointError, match=r"m\.onnx is an ONNX model; this needs PyTorch"):
        load_any(found)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nothing", r"nothing does not exist$"),
        (lambda p: p.joinpath("empty").mkdir() or p / "empty",
         r"empty is a folder without model\.safetensors or pytorch_model\.bin"),
        (lambda p: p.joinpath("w.pth").write_bytes(b"text, not a pickle") and p / "w.pth",
         r"w\.pth is not a weights file vitkit reads: it is text"),
        (lambda p: p.joinpath("w.safetensors").write_bytes(b"\x10" + bytes(20)) and
         p / "w.safetensors", r"w\.safetensors is not a valid safetensors file"),
    ],
    ids=["missing", "empty-folder", "not-a-pickle", "not-safetensors"],
)  # fmt: skip
def test_what_cannot_be_read_is_said_as_what_it_is(tmp_path, make, message):
    with pytest.raises(CheckpointError, match=message) as err:
        inspect(make(tmp_path))
    assert "\n" not in str(err.value) and "header too large" not in str(err.value)


def test_a_doctored_config_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "m.safetensors"
    vitkit.save(_model(), path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    config = json.loads(metadata["vitkit_config"])
    metadata["vitkit_config"] = json.dumps({**config, "img_size": 4096, "depth": 2})
    save_file(load_file(str(path)), str(path), metadata=metadata)
    monkeypatch.setattr(info_module, "load_state_dict", None)  # no tensor may be read
    with pytest.raises(CheckpointError, match=r"config does not match its tensors"):
        inspect(path)


def test_a_load_inspects_each_file_once(tmp_path, monkeypatch):
    """The loaders act on the one answer: the header of each file is read once, however the
    file is loaded (vitkit.load, load_any, load_pretrained, a distillation teacher)."""
    from vitkit.train.teacher import load_teacher

    vitkit.save(_model(), tmp_path / "m.safetensors", meta={"class_names": NAMES})
    real, reads = info_module.safetensors_header, []

    def counted(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(info_module, "safetensors_header", counted)
    student = {"student_mean": (0.5,) * 3, "student_std": (0.5,) * 3, "student_size": (32, 32)}
    for load in (vitkit.load, load_any, vitkit.load_pretrained,
                 lambda p: load_teacher(str(p), weights=None, **student)):  # fmt: skip
        reads.clear()
        load(tmp_path / "m.safetensors")
        assert reads == [tmp_path / "m.safetensors"], load


def test_an_architecture_name_of_other_sizes_is_refused(tmp_path):
    model = vitkit.create_model("vit_digits", num_heads=4)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    assert load_any(tmp_path / "w.pth", arch="vit_digits").config.num_heads == 4
    with pytest.raises(ArchMismatchError, match=r"have embed_dim 64 \(vit_mnist: 128\), depth 4"):
        load_any(tmp_path / "w.pth", arch="vit_mnist")


def test_a_head_count_that_contradicts_a_checkpoint_is_refused(tmp_path):
    vitkit.save(_model(), tmp_path / "m.safetensors")
    assert load_any(tmp_path / "m.safetensors", num_heads=4).config.num_heads == 4
    with pytest.raises(CheckpointError, match=r"checkpoint of 4 heads, .* count of 2 contradicts"):
        load_any(tmp_path / "m.safetensors", num_heads=2)
