"""Format detection and the weights file of a hub folder."""

from __future__ import annotations

import pytest

from vitkit import CheckpointError, convert


def test_detect_format():
    assert convert.detect_format({"conv_proj.weight": 0}) == "torchvision"
    assert convert.detect_format({"vit.embeddings.patch_embeddings.projection.weight": 0}) == "hf"
    assert convert.detect_format({"module.patch_embed.proj.weight": 0}) == "timm"
    assert convert.detect_format({"params/embedding/kernel": 0}) == "jax"
    with pytest.raises(CheckpointError, match=r"cannot tell the checkpoint format .*pass format="):
        convert.detect_format({"encoder.weight": 0})


def test_weights_file_of_a_hub_folder(tmp_path):
    assert convert.weights_file(tmp_path / "vit.pth") == tmp_path / "vit.pth"  # a file: itself
    (tmp_path / "pytorch_model.bin").write_bytes(b"0")
    assert convert.weights_file(str(tmp_path)) == tmp_path / "pytorch_model.bin"
    (tmp_path / "model.safetensors").write_bytes(b"0")
    assert convert.weights_file(tmp_path) == tmp_path / "model.safetensors"  # preferred
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"without model\.safetensors or pytorch_model\.bin"):
        convert.weights_file(empty)
