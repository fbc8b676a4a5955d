"""Checkpoints: save / load round trips, refusal of code-running pickles, one-line errors for
broken files, atomic writes, and the file formats `load_pretrained` detects."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

import vitkit
from vitkit import CheckpointError, VisionTransformer, convert
from vitkit.files import atomic_write
from vitkit.weights.checkpoint import load_into, load_state_dict

SMALL = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3)


def small(**options) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**SMALL, **options}).eval()


SAVE_CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param(dict(img_size=(16, 24)), id="tuple-img-size"),
    pytest.param(dict(pos_embed="sincos2d"), id="sincos2d"),
    pytest.param(dict(pos_embed="sinusoid", class_token=False, global_pool="avg"), id="sinusoid"),
    pytest.param(dict(pos_embed="none", num_classes=0), id="no-pos-no-head"),
    pytest.param(dict(distilled=True), id="distilled"),
    pytest.param(dict(encoder="torch"), id="torch-encoder"),
    pytest.param(dict(patch_embed="unfold", embed_norm=True), id="unfold"),
    pytest.param(dict(init_values=1e-4, qkv_bias=False, patch_size=(4, 8)), id="layerscale"),
    pytest.param(dict(dynamic_img_size=True, norm_eps=1e-12), id="dynamic"),
]


@pytest.mark.parametrize("options", SAVE_CONFIGS)
def test_save_load_round_trip(tmp_path, options):
    model = small(**options)
    path = tmp_path / "run" / "model.safetensors"
    vitkit.save(model, path, meta={"classes": ["a", "b", "c"], "epoch": 3})
    loaded = vitkit.load(path)
    assert loaded.config == model.config
    assert loaded.meta == {"classes": ["a", "b", "c"], "epoch": 3}
    assert not loaded.training
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    # load_pretrained reads the same file as 'vitkit' weights with their saved config.
    again = vitkit.load_pretrained(path)
    assert again.config == model.config


def test_load_unwraps_training_checkpoints(tmp_path):
    model = small()
    torch.save({"model": model.state_dict(), "epoch": 4}, tmp_path / "ckpt.pth")
    sd = load_state_dict(tmp_path / "ckpt.pth")
    assert sd.keys() == model.state_dict().keys()
    loaded = vitkit.load_pretrained(tmp_path / "ckpt.pth", num_heads=2)
    assert loaded.config == model.config.replace(patch_size=4)


class RunsCode:
    """Unpickling this calls os.system: a stand-in for a malicious checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["zip", "legacy", "plain-pickle"])
def test_code_running_pickle_is_refused(tmp_path, kind):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pth"
    payload = {"weight": torch.ones(2), "x": RunsCode(marker)}
    if kind == "zip":
        torch.save(payload, path)
    elif kind == "legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(CheckpointError, match=r"^refusing to load .*evil\.pth: it needs") as err:
        load_state_dict(path)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match=r"refusing to load"):
        vitkit.load_pretrained(path)
    assert not marker.exists()


def test_npz_with_pickled_objects_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.npz"
    np.savez(path, **{"embedding/kernel": np.array([RunsCode(marker)], dtype=object)})
    with pytest.raises(CheckpointError, match=r"refusing to load .* pickled Python objects"):
        vitkit.load_pretrained(path)
    assert not marker.exists()


def _safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    vitkit.save(small(), path)
    return path


def _pth(tmp_path):
    path = tmp_path / "model.pth"
    torch.save(small().state_dict(), path)
    return path


def _npz(tmp_path):
    path = tmp_path / "model.npz"
    np.savez(path, a=np.ones((64, 64)), b=np.zeros(10))
    return path


@pytest.mark.parametrize(
    "make, pattern",
    [
        (_safetensors, r"is not a valid safetensors file \(.*\); it may be truncated"),
        (_pth, r"is not a readable PyTorch checkpoint \(.*\); it may be truncated"),
        (_npz, r"is not a readable \.npz archive \(.*\); it may be truncated"),
    ],
)
def test_truncated_file_gives_one_line(tmp_path, make, pattern):
    path = make(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=pattern) as err:
        vitkit.load_pretrained(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["model.safetensors", "model.pth", "model.npz", "model.bin"])
def test_empty_file_gives_one_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\); the file was not written"):
        vitkit.load_pretrained(path)


def test_an_image_given_as_weights_is_named_as_such(tmp_path):
    """A photo passed where the weights go: not "it needs arbitrary unpickling", which torch's
    weights-only reader reports for any byte it cannot parse."""
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    pattern = r"photo\.png is not a weights file vitkit reads: it is a PNG image; give a \."
    with pytest.raises(CheckpointError, match=pattern):
        load_state_dict(tmp_path / "photo.png")


@pytest.mark.parametrize(
    "name, data, pattern",
    [
        (
            "notes.pth",
            b"hello, this is text",
            r"notes\.pth is not a weights file vitkit reads: it is text; give a \.safetensors, "
            r"\.pth or \.bin file, a JAX \.npz or a Hub folder$",
        ),
        (
            "model.onnx",
            b"\x08\x09\x12\x07pytorch",
            r"model\.onnx is not a weights file vitkit reads: it is an ONNX model",
        ),
        (
            "noise.pth",
            bytes(range(1, 64)) + b"\xff\xfe",
            r"noise\.pth is not a weights file vitkit reads: its first bytes match no weights",
        ),
        ("image.safetensors", b"\x89PNG\r\n\x1a\n" + bytes(64), r"is not a valid safetensors"),
        ("weights.bin", b"PK\x03\x04 not really a zip", r"is not a readable PyTorch checkpoint"),
    ],
)
def test_wrong_format_gives_one_line(tmp_path, name, data, pattern):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=pattern) as err:
        load_state_dict(path)
    assert "\n" not in str(err.value)


def test_npz_given_to_load_state_dict_points_to_from_jax(tmp_path):
    path = _npz(tmp_path)
    with pytest.raises(CheckpointError, match=r"NumPy \.npz archive .*convert\.from_jax"):
        load_state_dict(path)


def test_state_dict_of_non_tensors_is_refused(tmp_path):
    path = tmp_path / "meta.pth"
    torch.save({"epoch": 3, "lr": 0.1}, path)
    with pytest.raises(CheckpointError, match=r"does not hold a state dict of tensors"):
        load_state_dict(path)


def test_unknown_keys_give_format_error(tmp_path):
    path = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"encoder.weight": torch.ones(2)}, str(path))
    with pytest.raises(CheckpointError, match=r"cannot tell the checkpoint format"):
        vitkit.load_pretrained(path)
    with pytest.raises(CheckpointError, match=r"no vitkit config in its metadata"):
        vitkit.load(path)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.safetensors does not exist$"):
        vitkit.load_pretrained(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match=r"is a folder without model\.safetensors"):
        vitkit.load_pretrained(tmp_path)


def test_atomic_write_keeps_previous_file_on_crash(tmp_path):
    path = tmp_path / "model.safetensors"
    vitkit.save(small(), path)
    before = path.read_bytes()

    def crash(f):
        f.write(b"half a file")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_load_into_reports_readably():
    model = small()
    sd = model.state_dict()
    sd["head.weight"] = torch.zeros(5, 32)
    sd.pop("norm.bias")
    sd["extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as err:
        load_into(model, sd, source="ckpt.pth")
    assert str(err.value).startswith(
        "ckpt.pth does not match the model (missing: norm.bias; unexpected: extra; "
        "wrong shape: head.weight: checkpoint (5, 32) vs model (3, 32))"
    )


def test_hf_folder_with_pytorch_bin(tmp_path):
    model = small()
    torch.save(convert.to_hf(model), tmp_path / "pytorch_model.bin")
    import json

    (tmp_path / "config.json").write_text(json.dumps(convert.to_hf_config(model.config)))
    loaded = vitkit.load_pretrained(tmp_path)
    assert loaded.config == model.config.replace(patch_size=4)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=1e-6, rtol=0)


def test_format_argument_is_checked():
    with pytest.raises(ValueError, match=r"unknown format 'onnx'"):
        vitkit.load_pretrained({}, format="onnx")


def test_npz_is_a_zip_but_not_a_torch_checkpoint(tmp_path):
    path = _npz(tmp_path)
    assert zipfile.is_zipfile(path)
    from vitkit.weights.checkpoint import is_npz_file

    assert is_npz_file(path)
    assert not is_npz_file(_pth(tmp_path))


def _rewrite_metadata(path, edit) -> None:
    """The same tensors, with the metadata changed by `edit(metadata)`."""
    from safetensors.torch import load_file, safe_open, save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    edit(metadata)
    save_file(load_file(str(path)), str(path), metadata=metadata)


def _edit_config(**changes):
    def edit(metadata):
        config = json.loads(metadata["vitkit_config"])
        config.update(changes)
        metadata["vitkit_config"] = json.dumps(config)

    return edit


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(depth=1_000_000), r"invalid vitkit config: depth must be in \[1, 1024\]"),
        (dict(depth=1000), r"config says depth 1000 but the file holds 2 blocks"),
        (dict(img_size=4096), r"does not match its tensors \(wrong shape: pos_embed"),
        (dict(embed_dim=65536, num_heads=2), r"does not match its tensors"),
        (dict(num_classes=7), r"head\.weight: checkpoint \(3, 32\) vs model \(7, 32\)"),
    ],
    ids=["huge-depth", "depth", "img-size", "width", "classes"],
)
def test_config_is_checked_against_the_header_before_building(
    tmp_path, monkeypatch, changes, pattern
):
    """A config edited to claim a huge model is refused from the header's shapes alone: no
    model is built on a real device (built ones are recorded)."""
    path = tmp_path / "m.safetensors"
    vitkit.save(small(), path)
    _rewrite_metadata(path, _edit_config(**changes))
    built = []
    init = VisionTransformer.__init__

    def recording(self, *args, **kwargs):  # every ViT built, by whichever caller
        init(self, *args, **kwargs)
        built.append(next(self.parameters()).device.type)

    monkeypatch.setattr(VisionTransformer, "__init__", recording)
    with pytest.raises(CheckpointError, match=pattern) as err:
        vitkit.load(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert set(built) <= {"meta"}


@pytest.mark.parametrize(
    "meta, pattern",
    [
        ("{not json", r"invalid vitkit metadata"),
        ("[1, 2]", r"invalid vitkit metadata: expected a JSON object"),
        (json.dumps({"class_names": ["a", 3, "c"]}), r"invalid class_names"),
        (json.dumps({"class_names": ["a", "b"]}), r"names 2 classes but its model has 3 outputs"),
    ],
)
def test_bad_metadata_is_one_line(tmp_path, meta, pattern):
    path = tmp_path / "m.safetensors"
    vitkit.save(small(), path, meta={"class_names": ["a", "b", "c"]})

    def edit(metadata):
        metadata["vitkit_meta"] = meta

    _rewrite_metadata(path, edit)
    with pytest.raises(CheckpointError, match=pattern):
        vitkit.load(path)


def test_load_pretrained_checks_the_saved_config_too(tmp_path):
    path = tmp_path / "m.safetensors"
    vitkit.save(small(), path)
    _rewrite_metadata(path, _edit_config(img_size=4096))
    with pytest.raises(CheckpointError, match=r"config does not match its tensors"):
        vitkit.load_pretrained(path, num_classes=5)
