"""`vitkit convert`: the library's hints in convert's own flags, never a flag it lacks; the
parity line against the source library's own model (timm's named model, transformers' model of
the folder's config), or saying what it could not check."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import torch

import vitkit
from _helpers import randomize, requires_timm
from vitkit import cli

from ._cli import timm_vit

requires_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="needs transformers, which is not installed (pip install -e '.[interop]')",
)


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


# -- the parity line: against the source's own model, or saying what it could not check ------

SIGLIP = "vit_base_patch32_siglip_gap_256"  # tanh GELU, which timm weights do not record
NOT_OK = re.compile(r"\bok\b")
NO_NAME = (
    "; the weights do not record the activation (exact GELU assumed), the norm epsilon (1e-06 "
    "assumed), the block order (pre-norm assumed), the head count (12 assumed) and the pooling "
    "('avg' assumed): pass --arch NAME to check against timm"
)


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    """A random two-block timm SigLIP (gap) and its state dict saved as a .safetensors file."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = randomize(timm.create_model(SIGLIP, pretrained=False, depth=2))
    path = tmp_path_factory.mktemp("siglip") / "siglip.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    return source, path


def _images(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


@requires_timm
def test_a_state_dict_without_its_name_is_checked_for_the_mapping_only(siglip, tmp_path, run_cli):
    """Without a name the reference is timm's model of vitkit's own guesses, which agree with
    vitkit by construction: the line says so and names the guesses, never "ok"."""
    source, weights = siglip
    out = tmp_path / "v.safetensors"
    code, text, _ = run_cli("convert", "--from", "timm", weights, out)
    line = text.splitlines()[-1]
    assert code == 0, text
    head = re.fullmatch(
        r"parity: checked the key mapping only, against timm's VisionTransformer built from "
        r"vitkit's inferred config: max \|difference\| (\S+) over the pooled features and "
        r"tokens of a random batch of 2 \(within tolerance 1e-04\)(.*)",
        line,
    )
    assert head and float(head[1]) <= 1e-4 and head[2] == NO_NAME
    assert not NOT_OK.search(line)
    # what the old line called "ok": timm's own model computes another function (tanh GELU)
    converted, x = vitkit.load(out), _images(256)
    with torch.no_grad():
        tokens = (converted.forward_features(x) - source.forward_features(x)).abs().max()
    assert converted.config.act_layer == "gelu" and tokens > 1e-4  # 7.6e-4 measured


@requires_timm
def test_with_its_name_the_check_runs_against_timm(siglip, tmp_path, run_cli):
    """`--arch` names timm's model: built by timm.create_model at the weights' depth, loaded
    strictly, it computes what the converted model does (the tanh GELU from the name)."""
    source, weights = siglip
    out = tmp_path / "v.safetensors"
    argv = ["convert", "--from", "timm", weights, out, "--arch", SIGLIP]
    code, text, _ = run_cli(*argv)
    assert code == 0, text
    match = re.fullmatch(
        rf"parity vs timm {SIGLIP} \(depth=2\): max \|difference\| (\S+) over the pooled "
        r"features and tokens of a random batch of 2 \(ok, tolerance 1e-04\)",
        text.splitlines()[-1],
    )
    assert match and float(match[1]) <= 1e-4
    converted, x = vitkit.load(out), _images(256)
    assert (converted.config.act_layer, converted.meta["model_name"]) == ("gelu_tanh", SIGLIP)
    with torch.no_grad():
        torch.testing.assert_close(converted.forward_features(x), source.forward_features(x),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


@requires_timm
@pytest.mark.parametrize("kind", ["timm folder", "vitkit checkpoint", "timm training checkpoint"])
def test_the_name_a_file_records_is_checked_against(kind, siglip, tmp_path, run_cli):
    """A timm folder's `architecture`, a converted checkpoint's `model_name` and a timm
    training checkpoint's `arch` name the model, without --arch."""
    from timm.models._hub import save_for_hf

    source, weights = siglip
    if kind == "timm folder":
        path = tmp_path / "hub"
        save_for_hf(source, str(path), safe_serialization=True)
    elif kind == "vitkit checkpoint":
        path = tmp_path / "named.safetensors"
        argv = ["--from", "timm", weights, path, "--arch", SIGLIP]
        assert run_cli("convert", *argv, "--no-parity")[0] == 0
    else:
        path = tmp_path / "checkpoint.pth"
        torch.save({"arch": SIGLIP, "epoch": 3, "state_dict": source.state_dict()}, path)
    code, text, _ = run_cli("convert", "--from", "timm", path, tmp_path / "v.safetensors")
    assert code == 0, text
    assert text.splitlines()[-1].startswith(f"parity vs timm {SIGLIP} (depth=2): max |diff")
    assert text.splitlines()[-1].endswith("(ok, tolerance 1e-04)")
    assert vitkit.load(tmp_path / "v.safetensors").config.act_layer == "gelu_tanh"


@requires_timm
def test_a_wrong_name_is_a_mismatch_or_a_refusal(siglip, tmp_path, run_cli):
    """A name of another patch size: timm's model cannot hold the weights (exit 1); a head
    count other than the name's: the outputs differ (exit 1); a name whose pooling the weights
    lack: the conversion refuses (exit 2)."""
    convert = ("convert", "--from", "timm", siglip[1], tmp_path / "v.st")
    code, text, _ = run_cli(*convert, "--arch", "vit_base_patch16_siglip_gap_224")
    assert code == 1 and text.splitlines()[-1] == (
        "parity vs timm vit_base_patch16_siglip_gap_224 (depth=2, img_size=256): MISMATCH: "
        "that model does not hold these weights (wrong shape: patch_embed.proj.weight: "
        "checkpoint (768, 3, 32, 32) vs model (768, 3, 16, 16), pos_embed: checkpoint "
        "(1, 64, 768) vs model (1, 256, 768))"
    )
    code, text, _ = run_cli(*convert, "--arch", SIGLIP, "--num-heads", "8")
    match = re.fullmatch(
        rf"parity vs timm {SIGLIP} \(depth=2\): max \|difference\| (\S+) over the pooled "
        r"features and tokens of a random batch of 2 \(MISMATCH, tolerance 1e-04\)",
        text.splitlines()[-1],
    )
    assert code == 1 and match and float(match[1]) > 0.1
    (tmp_path / "v.st").unlink()
    code, _, err = run_cli(*convert, "--arch", "vit_base_patch32_224")
    assert code == 2 and err.startswith("vitkit: error: timm weights do not fit the inferred")
    assert not (tmp_path / "v.st").exists()


@requires_timm
def test_without_timm_the_line_says_what_was_not_checked(siglip, tmp_path, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # as if not installed
    convert = ("convert", "--from", "timm", siglip[1], tmp_path / "v.st")
    code, text, _ = run_cli(*convert)
    missing = "not checked: timm is not installed (pip install 'vitkit[interop]')"
    assert (code, text.splitlines()[-1]) == (0, f"parity: {missing}{NO_NAME}")
    code, text, _ = run_cli(*convert, "--arch", SIGLIP)
    assert (code, text.splitlines()[-1]) == (0, f"parity vs timm {SIGLIP}: {missing}")


# -- Hugging Face ViT: the folder's (or the given) config.json -------------------------------


def _hf_folder(path):
    """A random Hugging Face ViTForImageClassification saved with `save_pretrained`."""
    import transformers

    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8,
                                    num_labels=3, hidden_act="gelu")  # fmt: skip
    torch.manual_seed(0)
    randomize(transformers.ViTForImageClassification(config)).save_pretrained(path)
    return path


HF_OK = (
    r"parity vs transformers ViTForImageClassification: max \|difference\| (\S+) over the "
    r"logits of a random batch of 2 \(ok, tolerance 1e-04\)"
)


@requires_transformers
def test_a_hugging_face_folder_is_checked_against_transformers(tmp_path, run_cli):
    folder = _hf_folder(tmp_path / "hf")
    convert = ("convert", "--from", "hf", folder, tmp_path / "v.st")
    code, text, _ = run_cli(*convert)
    match = re.fullmatch(HF_OK, text.splitlines()[-1])
    assert code == 0 and match and float(match[1]) <= 1e-4, text
    code, text, _ = run_cli(*convert, "--num-heads", "2")  # not the config's 4
    assert code == 1 and text.splitlines()[-1].endswith("(MISMATCH, tolerance 1e-04)")


@requires_transformers
def test_the_class_names_of_a_hugging_face_folder_are_kept(tmp_path, run_cli):
    """A folder's id2label travels into the converted checkpoint (and so into `predict`'s
    labels and an HF export), as `load_any` keeps it; a new head of another size drops it."""
    import transformers

    folder = _hf_folder(tmp_path / "hf")
    config = transformers.ViTConfig.from_pretrained(folder)
    config.id2label = {0: "cat", 1: "dog", 2: "fox"}
    config.save_pretrained(folder)
    code, text, _ = run_cli("convert", "--from", "hf", folder, tmp_path / "v.st", "--no-parity")
    assert code == 0, text
    assert vitkit.load(tmp_path / "v.st").meta["class_names"] == ["cat", "dog", "fox"]
    assert vitkit.load_pretrained(folder).meta == {"class_names": ["cat", "dog", "fox"]}
    assert getattr(vitkit.load_pretrained(folder, num_classes=5), "meta", {}) == {}


@requires_transformers
def test_hugging_face_weights_without_their_config(tmp_path, run_cli, monkeypatch):
    """A bare state dict: the key mapping only, naming HF's defaults; with --hf-config,
    transformers' own model of that config."""
    folder = _hf_folder(tmp_path / "hf")
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes((folder / "model.safetensors").read_bytes())
    convert = ("convert", "--from", "hf", weights, tmp_path / "v.st", "--num-heads", "4")
    code, text, _ = run_cli(*convert)
    line = text.splitlines()[-1]
    assert code == 0 and not NOT_OK.search(line)
    assert line.startswith(
        "parity: checked the key mapping only, against transformers' "
        "ViTForImageClassification built from vitkit's inferred config: max |difference| "
    )
    assert line.endswith(
        "; the weights do not record the activation (exact GELU assumed) and the norm epsilon "
        "(1e-12 assumed): pass --hf-config JSON to check against transformers"
    )
    code, text, _ = run_cli(*convert, "--hf-config", folder / "config.json")
    assert code == 0 and re.fullmatch(HF_OK, text.splitlines()[-1]), text
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    code, text, _ = run_cli(*convert, "--hf-config", folder / "config.json")
    assert (code, text.splitlines()[-1]) == (
        0,
        "parity: not checked: transformers is not installed (pip install 'vitkit[interop]')",
    )
