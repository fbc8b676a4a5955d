"""A Swin exported: `vitkit export --format onnx / pt2` checked with onnxruntime and
torch.export (fixed and dynamic batch; a dynamic image size refused in one line), a
features_only backbone as ONNX, TorchScript trace and torch.fx on the plain path."""

from __future__ import annotations

import warnings

import pytest
import torch

from _helpers import optional_import, requires_onnx
from vitkit import SwinTransformer, create_model, save
from vitkit.cli import main
from vitkit.export import export_onnx

ort = optional_import("onnxruntime")
TINY = dict(embed_dim=16, num_heads=(1, 2), depths=(2, 2), img_size=32, window_size=4,
            num_classes=5)  # fmt: skip


def tiny() -> SwinTransformer:
    torch.manual_seed(0)
    return create_model("swin_tiny_patch4_window7_224", **TINY).eval()


def run_onnx(path, x: torch.Tensor) -> list[torch.Tensor]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(out) for out in session.run(None, {"image": x.numpy()})]


@pytest.mark.slow
@requires_onnx
def test_cli_exports_a_swin_as_onnx_with_fixed_and_dynamic_batch(tmp_path, capsys):
    model = tiny()
    save(model, tmp_path / "swin.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "swin.safetensors")]
    dynamic, fixed = tmp_path / "dynamic.onnx", tmp_path / "fixed.onnx"
    assert main(argv + ["--verify", str(dynamic)]) == 0  # onnxruntime within 1e-4, batch 3
    assert main(argv + ["--static-batch", "--verify", str(fixed)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {fixed} (onnx; batch 1, image size 32x32;" in out
    assert f"wrote {dynamic} (onnx; batch dynamic, image size 32x32;" in out
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(run_onnx(dynamic, x)[0], want, atol=1e-4, rtol=0)
    torch.testing.assert_close(run_onnx(fixed, x[:1])[0], want[:1], atol=1e-4, rtol=0)
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):  # the fixed graph takes batch 1
        run_onnx(fixed, x)


def test_dynamic_image_size_is_refused_in_one_line(tmp_path, capsys):
    save(tiny(), tmp_path / "swin.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "swin.safetensors"), "--dynamic-img-size"]
    assert main(argv + [str(tmp_path / "m.onnx")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("a Swin exports at a fixed image size (its windows, padding and shift "
                        "masks follow the input size, which torch.export does not trace); "
                        "drop it") and "\n" not in err  # fmt: skip
    with pytest.raises(ValueError, match="^a Swin exports at a fixed image size"):
        export_onnx(tiny(), tmp_path / "m.onnx", dynamic_img_size=True)


@pytest.mark.slow
def test_cli_exports_a_swin_as_a_torch_export_program(tmp_path, capsys):
    model = tiny()
    save(model, tmp_path / "swin.safetensors")
    out = tmp_path / "swin.pt2"
    argv = ["export", "--checkpoint", str(tmp_path / "swin.safetensors"), "--format", "pt2"]
    assert main(argv + [str(out)]) == 0
    assert "(pt2; batch dynamic, image size 32x32;" in capsys.readouterr().out
    program = torch.export.load(str(out)).module()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=1e-5, rtol=0)


@pytest.mark.slow
@requires_onnx
def test_a_swin_backbone_exports_its_stage_maps(tmp_path):
    torch.manual_seed(0)
    backbone = create_model("swin_tiny_patch4_window7_224", features_only=True, **TINY).eval()
    path = export_onnx(backbone, tmp_path / "backbone.onnx", verify=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = backbone(x)
    got = run_onnx(path, x)
    assert [g.shape for g in got] == [(2, 16, 8, 8), (2, 32, 4, 4)]
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have, expected, atol=1e-4, rtol=0)


def test_torchscript_trace_and_fx_on_the_plain_path():
    """TorchScript by tracing, as the ViT's export test (`torch.jit.script` does not compile a
    Swin: its config and timm API use dict unpacking and other Python it lacks); torch.fx
    traces the shapes symbolically."""
    model = tiny()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; tracing warns about checks
        want = model(x)
        torch.testing.assert_close(torch.jit.trace(model, (x,))(x), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), want, atol=1e-5, rtol=0)
