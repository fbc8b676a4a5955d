"""`vitkit convert`: the library's hints in convert's own flags, never a flag it lacks."""

from __future__ import annotations

import re

import pytest
import torch

import vitkit
from vitkit import cli

from ._cli import timm_vit


def _convert_flags() -> set[str]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices["convert"].flags()


def _suggested(err: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z-]*", err))


def test_a_family_option_the_weights_lack_asks_for_arch(tmp_path, run_cli):
    """CLIP-style timm weights do not record their activation and norm epsilon: convert asks
    for its --arch (not the act_layer= / norm_eps= it has no flags for), and takes it."""
    pytest.importorskip("timm")
    torch.save(timm_vit(pre_norm=True, no_embed_class=False).state_dict(), tmp_path / "w.pth")
    out = tmp_path / "v.safetensors"
    code, _, err = run_cli("convert", "--from", "timm", tmp_path / "w.pth", out, "--no-parity")
    assert (code, err) == (
        2,
        "vitkit: error: the weights have CLIP-style norm_pre, whose act_layer and norm_eps they "
        "do not record; pass --arch NAME\n",
    )
    argv = ["--arch", "vit_base_patch16_clip_224", "--no-parity"]
    assert run_cli("convert", "--from", "timm", tmp_path / "w.pth", out, *argv)[0] == 0
    named, loaded = vitkit.get_config("vit_base_patch16_clip_224"), vitkit.load(out).config
    assert (
        (loaded.act_layer, loaded.norm_eps) == (named.act_layer, named.norm_eps) != ("gelu", 1e-6)
    )


def test_what_no_flag_gives_is_left_to_python(tmp_path, run_cli):
    """A position table that fits two grids needs img_size= or no_embed_class=: convert has
    no flag for either and says so, naming the Python call."""
    weights = vitkit.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=1,
                                       num_heads=3, reg_tokens=8).state_dict()  # fmt: skip
    weights["pos_embed"] = torch.zeros(1, 25, 192)  # 5 x 5, or 4 x 4 + 9 prefix tokens
    torch.save(weights, tmp_path / "w.pth")
    code, _, err = run_cli("convert", "--from", "timm", tmp_path / "w.pth", tmp_path / "v.st")
    assert code == 2 and err.endswith(
        "; the command line cannot give it: load the weights in Python with "
        "vitkit.load_pretrained(..., img_size=(h, w) or no_embed_class=True / False) and "
        "vitkit.save them\n"
    )
    assert _suggested(err) == set()


def test_convert_never_suggests_a_flag_it_lacks(tmp_path, run_cli):
    torch.save(vitkit.VisionTransformer(embed_dim=40, depth=1, num_heads=4, img_size=16,
                                        patch_size=8).state_dict(), tmp_path / "w.pth")  # fmt: skip
    errors = [
        run_cli("convert", "--from", "timm", tmp_path / "w.pth", tmp_path / "v.st")[2],
        run_cli("convert", "--from", "timm", tmp_path / "w.pth", tmp_path / "v.st",
                "--hf-config", tmp_path / "c.json")[2],
        run_cli("convert", "--from", "timm", tmp_path / "w.pth", tmp_path / "v.st",
                "--arch", "vit_base_patch16_224")[2],
    ]  # fmt: skip
    assert [_suggested(err) for err in errors] == [
        {"--num-heads"},
        {"--hf-config", "--from"},
        set(),
    ]
    assert all(_suggested(err) <= _convert_flags() for err in errors)
