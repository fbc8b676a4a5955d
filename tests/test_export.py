"""ONNX (onnxruntime parity), torch.export and TorchScript trace of the model in eval mode."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from _helpers import randomize, requires_onnx, requires_timm, requires_transformers
from vitkit import VisionTransformer, ViTBackbone, export_onnx, save
from vitkit.cli import main
from vitkit.export import check_onnx, export_program

try:  # the ONNX tests are marked requires_onnx; the torch.export and TorchScript ones run
    import onnx
    import onnxruntime as ort
except ModuleNotFoundError:
    onnx = ort = None


def tiny(**overrides) -> VisionTransformer:
    """A small model on randomised weights (biases, norms and head far from their initial
    zeros and ones), so that no output is near zero and an exported graph that drops a term
    cannot pass; the same options give the same weights."""
    torch.manual_seed(0)
    options = dict(
        img_size=(60, 100), patch_size=20, embed_dim=16, depth=2, num_heads=2, num_classes=5
    )
    options.update(overrides)
    return randomize(VisionTransformer(**options))


def run_onnx(path, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"image": x.numpy()})
    return torch.from_numpy(out)


def input_dims(path) -> list:
    graph = onnx.load(str(path)).graph
    return [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    model = tiny()
    path = export_onnx(model, tmp_path_factory.mktemp("onnx") / "fixed.onnx")
    return model, path


@requires_onnx
def test_onnx_fixed_size_parity(fixed):
    model, path = fixed
    assert [p.name for p in path.parent.iterdir()] == ["fixed.onnx"]  # weights inside
    assert input_dims(path) == ["batch", 3, 60, 100]
    assert [o.name for o in onnx.load(str(path)).graph.output] == ["logits"]
    for batch in (1, 3):
        x = torch.randn(batch, 3, 60, 100)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(run_onnx(path, x), expected, rtol=0, atol=1e-4)


@requires_onnx
def test_check_onnx_catches_a_mismatch(fixed):
    model, path = fixed
    assert check_onnx(model, path) <= 1e-4
    changed = tiny()
    with torch.no_grad():
        changed.head.bias += 0.01
    with pytest.raises(ValueError, match=r"onnxruntime differs from PyTorch by 1\.00e-02"):
        check_onnx(changed, path)


@requires_onnx
def test_onnx_dynamic_img_size_parity_at_other_sizes(tmp_path):
    model = tiny(dynamic_img_size=True, pos_embed="learn").train()
    path = export_onnx(model, tmp_path / "dyn.onnx", verify=True)
    assert model.training  # the training flag is restored
    model.eval()
    assert input_dims(path) == ["batch", 3, "20*grid_height", "20*grid_width"]
    resize = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Resize"]
    assert len(resize) == 1  # the learned grid is resampled in the graph
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in resize[0].attribute}
    assert (attrs["mode"], attrs["antialias"]) == (b"cubic", 1)
    # native 3x5 grid, a larger and transposed one, and a smaller one (antialiased shrink)
    for height, width in [(60, 100), (100, 60), (40, 40), (120, 160)]:
        x = torch.randn(2, 3, height, width)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(run_onnx(path, x), expected, rtol=0, atol=1e-4)


def test_onnx_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"opset 17 is too old: .* pass opset=18"):
        export_onnx(tiny(), tmp_path / "m.onnx", opset=17)


def test_torch_export_eval_mode():
    model = tiny()
    x = torch.randn(2, 3, 60, 100)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=0, atol=1e-5)


def test_export_program_dynamic_batch_and_size(tmp_path):
    model = tiny()  # fixed-size model: export_program exports a dynamic-size copy
    program = export_program(model, dynamic_img_size=True)
    torch.export.save(program, tmp_path / "m.pt2")
    loaded = torch.export.load(tmp_path / "m.pt2").module()
    reference = tiny(dynamic_img_size=True)
    for shape in [(3, 3, 60, 100), (2, 3, 80, 40)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), reference(x), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="differs from the model's img_size 60x100"):
        model(torch.randn(1, 3, 80, 40))  # the user's model is unchanged


def test_torchscript_trace_round_trip(tmp_path):
    model = tiny()
    x = torch.randn(2, 3, 60, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; tracing warns about checks
        traced = torch.jit.trace(model, (x,))
        traced.save(str(tmp_path / "m.pt"))
        loaded = torch.jit.load(str(tmp_path / "m.pt"))
    x3 = torch.randn(3, 3, 60, 100)  # the batch stays dynamic
    with torch.no_grad():
        torch.testing.assert_close(loaded(x3), model(x3), rtol=0, atol=1e-5)


@requires_onnx
def test_cli_export_onnx(tmp_path, capsys):
    model = tiny(num_classes=0)
    save(model, tmp_path / "m.safetensors")
    out = tmp_path / "out" / "m.onnx"
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--format", "onnx"]
    assert main(argv + ["--dynamic-img-size", "--verify", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"wrote {out} (onnx; batch dynamic, image size dynamic; carries the data config)\n"
    )
    assert [o.name for o in onnx.load(str(out)).graph.output] == ["features"]
    x = torch.randn(1, 3, 40, 120)
    with torch.no_grad():
        expected = tiny(num_classes=0, dynamic_img_size=True)(x)
    np.testing.assert_allclose(run_onnx(out, x).numpy(), expected.numpy(), rtol=0, atol=1e-4)


@requires_onnx
def test_cli_export_onnx_int8(tmp_path, capsys):
    """--precision int8: onnxruntime's dynamic quantiser over the float32 graph (verified
    first): MatMulInteger nodes, a smaller file, logits near the float model's."""
    model = tiny(embed_dim=64, num_heads=4)
    save(model, tmp_path / "m.safetensors")
    out = tmp_path / "m.onnx"
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--precision", "int8"]
    assert main(argv + ["--verify", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.safetensors"]
    ops = {node.op_type for node in onnx.load(str(out)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    float_path = export_onnx(model, tmp_path / "float" / "m.onnx")
    assert out.stat().st_size < 0.5 * float_path.stat().st_size
    x = torch.randn(4, 3, 60, 100)
    with torch.no_grad():
        want = model(x)
    got = run_onnx(out, x)
    # measured 0.018-0.021 (logits up to 0.6-0.9) over three inputs: tolerance 0.05
    assert (got - want).abs().max() < 0.05 and want.abs().max() > 0.5


def test_cli_export_precision_refusals(tmp_path, capsys):
    save(tiny(), tmp_path / "m.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors")]
    assert main(argv + ["--precision", "bf16", str(tmp_path / "m.onnx")]) == 2
    assert "--precision bf16 is not offered for ONNX" in capsys.readouterr().err
    assert main(argv + ["--format", "hf", "--precision", "int8", str(tmp_path / "hf")]) == 2
    assert "--precision int8 exports ONNX only" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "hf").exists()


def test_cli_export_pt2_bf16(tmp_path, capsys):
    """--precision bf16 writes bf16 weights; the program takes float32 images (the patch
    embedding casts them)."""
    model = tiny()
    save(model, tmp_path / "m.safetensors")
    out = tmp_path / "m.pt2"
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--format", "pt2"]
    assert main(argv + ["--precision", "bf16", str(out)]) == 0
    program = torch.export.load(str(out))
    assert {t.dtype for t in program.state_dict.values()} == {torch.bfloat16}
    x = torch.randn(2, 3, 60, 100)
    with torch.no_grad():
        got, want = program.module()(x), model(x)
    assert got.dtype == torch.bfloat16
    # measured 2.5e-3-3.4e-3 (logits up to 0.33-0.35) over three inputs: tolerance 1e-2
    assert (got.float() - want).abs().max() < 1e-2 and want.abs().max() > 0.3


def test_cli_export_errors(tmp_path, capsys):
    out = str(tmp_path / "o.onnx")
    missing = str(tmp_path / "missing.safetensors")
    assert main(["export", "--checkpoint", missing, "--format", "pt2", "--verify", out]) == 2
    assert "--verify checks ONNX files; drop it for --format pt2" in capsys.readouterr().err
    assert main(["export", "--checkpoint", missing, out]) == 2
    assert "missing.safetensors does not exist" in capsys.readouterr().err
    save(tiny(), tmp_path / "m.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--opset", "16", out]
    assert main(argv) == 2
    assert "opset 16 is too old" in capsys.readouterr().err
    assert not (tmp_path / "o.onnx").exists()


@requires_onnx
@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        dict(distilled=True),
        dict(encoder="torch"),
        dict(pos_embed="sincos2d"),
        dict(global_pool="avg", class_token=False, patch_embed="unfold"),
    ],
)
def test_onnx_variants_dynamic(tmp_path, overrides):
    model = tiny(dynamic_img_size=True, **overrides)
    path = export_onnx(model, tmp_path / "m.onnx")
    for height, width in [(60, 100), (80, 40)]:
        x = torch.randn(2, 3, height, width)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(run_onnx(path, x), expected, rtol=0, atol=1e-4)


# The model options after the paper's ViT, each in a small model (embed_dim 32, one block).
NEWER_OPTIONS = {
    "registers": dict(reg_tokens=2),
    "no_embed_class": dict(reg_tokens=1, no_embed_class=True),
    "max": dict(global_pool="max"),
    "avgmax": dict(global_pool="avgmax"),
    "map": dict(global_pool="map"),
    "none": dict(global_pool="none", num_classes=0),
    "rmsnorm": dict(norm_layer="rmsnorm"),
    "swiglu": dict(mlp_layer="swiglu"),
    "swiglu_packed": dict(mlp_layer="swiglu_packed"),
    "gelu_tanh": dict(act_layer="gelu_tanh"),
    "quick_gelu": dict(act_layer="quick_gelu"),
    "silu": dict(act_layer="silu"),
    "qk_norm": dict(qk_norm=True),
    "res_post_norm": dict(res_post_norm=True, init_values=0.1),
    "dynamic_img_pad": dict(dynamic_img_size=True, dynamic_img_pad=True),
}


@requires_onnx
@pytest.mark.slow
@pytest.mark.parametrize("dynamic_img_size", [False, True], ids=["fixed", "dynamic"])
@pytest.mark.parametrize("overrides", NEWER_OPTIONS.values(), ids=NEWER_OPTIONS)
def test_onnx_newer_model_options(tmp_path, overrides, dynamic_img_size):
    """verify=True: onnxruntime within 1e-4 of PyTorch at the model's size and, dynamic, at
    another (and, for dynamic_img_pad, at one that is not a multiple of the patch)."""
    model = tiny(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4, **overrides)
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_img_size=dynamic_img_size, verify=True)
    grid = ["8*grid_height", "8*grid_width"] if dynamic_img_size else [32, 32]
    if dynamic_img_size and model.config.dynamic_img_pad:
        grid = ["height", "width"]
    assert input_dims(path) == ["batch", 3, *grid]


@requires_onnx
def test_onnx_of_a_dynamic_img_pad_model_pads_any_size(tmp_path):
    """The padding stays in the graph: a size that is not a multiple of the patch size gives
    PyTorch's output (it was traced away, and such sizes came out wrong)."""
    model = tiny(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4,
                 dynamic_img_size=True, dynamic_img_pad=True, global_pool="map")  # fmt: skip
    path = export_onnx(model, tmp_path / "pad.onnx", verify=True)
    assert input_dims(path) == ["batch", 3, "height", "width"]
    for height, width in [(36, 45), (17, 31), (32, 32)]:
        x = torch.randn(2, 3, height, width)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(run_onnx(path, x), expected, rtol=0, atol=1e-4)
    program = export_program(model)
    x = torch.randn(3, 3, 45, 20)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=0, atol=1e-5)


@requires_onnx
def test_backbone_onnx_and_torch_export(tmp_path):
    backbone = ViTBackbone(tiny(num_classes=0, depth=3), out_indices=(0, -1))
    path = export_onnx(backbone, tmp_path / "bb.onnx", dynamic_img_size=True, verify=True)
    outputs = onnx.load(str(path)).graph.output
    assert [o.name for o in outputs] == ["block0", "block2"]
    reference = ViTBackbone(tiny(num_classes=0, depth=3, dynamic_img_size=True), (0, -1)).eval()
    x = torch.randn(2, 3, 80, 40)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"image": x.numpy()})
    program = export_program(backbone).module()  # fixed size: the model's own setting
    y = torch.randn(3, 3, 60, 100)
    with torch.no_grad():
        expected = reference(x)
        for have, want in zip(got, expected):
            assert have.shape == (2, 16, 4, 2)
            torch.testing.assert_close(torch.from_numpy(have), want, rtol=0, atol=1e-4)
        for have, want in zip(program(y), backbone(y)):
            torch.testing.assert_close(have, want, rtol=0, atol=1e-5)


@requires_onnx
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_onnx_carries_the_data_config_and_class_names(tmp_path, precision):
    from vitkit.data.data_config import DataConfig
    from vitkit.export import CLASS_NAMES_PROP, DATA_CONFIG_PROP

    model = tiny()
    model.data_config = DataConfig(input_size=(3, 60, 100), mean=0.4, std=0.3, crop_pct=0.9)
    model.meta = {"class_names": ["cat", "dog", "eel", "émeu", "fox"]}
    path = export_onnx(model, tmp_path / "m.onnx", precision=precision)
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props[DATA_CONFIG_PROP]) == model.data_config.to_dict()
    assert json.loads(props[CLASS_NAMES_PROP]) == ["cat", "dog", "eel", "émeu", "fox"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    custom = session.get_modelmeta().custom_metadata_map  # what a serving runtime reads
    assert json.loads(custom[CLASS_NAMES_PROP])[3] == "émeu"
    if precision == "fp32":
        x = torch.randn(1, 3, 60, 100)
        with torch.no_grad():
            torch.testing.assert_close(run_onnx(path, x), model(x), rtol=0, atol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing staged is left


@requires_onnx
def test_onnx_and_program_files_never_replace_a_special_file(tmp_path):
    import os
    import stat

    from vitkit.export import save_program
    from vitkit.files import SpecialFileError

    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    with pytest.raises(SpecialFileError, match=f"^cannot write {fifo}: it is a FIFO"):
        export_onnx(tiny(), fifo)  # refused before the export, never blocked on the pipe
    with pytest.raises(SpecialFileError, match=f"^cannot write {fifo}: it is a FIFO"):
        save_program(export_program(tiny()), fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot create a device node here; needs root or CAP_MKNOD")
    assert export_onnx(tiny(), tmp_path / "null") == tmp_path / "null"
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)
    program = save_program(export_program(tiny()), tmp_path / "m.pt2")
    x = torch.randn(2, 3, 60, 100)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(program).module()(x), tiny()(x))


@requires_transformers
@requires_timm
def test_cli_export_folders_in_bf16(tmp_path, capsys):
    """--precision bf16 folders hold bf16 weights that transformers and timm load, with logits
    within bf16 rounding of the float32 model's."""
    import timm
    import transformers
    from safetensors.torch import load_file

    model = tiny(img_size=32, patch_size=8, embed_dim=64, num_heads=4, num_classes=3)
    save(model, tmp_path / "m.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "m.safetensors"), "--precision", "bf16"]
    for fmt in ("hf", "timm"):
        assert main(argv + ["--format", fmt, str(tmp_path / fmt)]) == 0
        weights = load_file(str(tmp_path / fmt / "model.safetensors"))
        assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    hf = transformers.ViTForImageClassification.from_pretrained(str(tmp_path / "hf")).float()
    theirs = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        assert want.abs().max() > 0.5
        # measured 3.3e-3-4.4e-3 (logits up to 0.76-0.84) over three inputs: tolerance 1.2e-2
        for got in (hf(pixel_values=x).logits, theirs(x)):
            assert (got - want).abs().max() < 1.2e-2
