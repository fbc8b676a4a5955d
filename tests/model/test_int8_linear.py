"""`Int8Linear`: oneDNN's int8 inner product with dynamic input quantisation, and the fused
int8 block built from it, against the arithmetic it stands for and torch's quantize_dynamic."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _helpers import randomize
from vitkit import VisionTransformer
from vitkit.model import precision
from vitkit.model.onednn_int8 import Int8Linear, int8_unsupported_reason, quantize_activation
from vitkit.model.precision import quantize_int8, set_precision
from vitkit.model.vit import onednn

pytestmark = pytest.mark.skipif(
    bool(int8_unsupported_reason()), reason=f"no oneDNN int8: {int8_unsupported_reason()}"
)


def _layer(in_features: int = 96, out_features: int = 192, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features)
    with torch.no_grad():
        layer.bias.normal_(0, 0.5)
    return layer


def _reference(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """The function an int8 layer computes: its input rounded to the uint8 grid of its range,
    times the dequantised weight, plus the bias, in float32."""
    q, scale, zero_point = quantize_activation(x.reshape(-1, x.shape[-1]))
    rows = (q.float() - zero_point) * scale
    return F.linear(rows, layer.dequantized_weight(), layer.bias).view(*x.shape[:-1], -1)


def test_the_quantised_input_is_within_half_a_step_and_keeps_zero_exact():
    x = torch.randn(50, 96) * 3
    q, scale, zero_point = quantize_activation(x)
    assert q.dtype == torch.uint8
    assert scale == pytest.approx((x.max() - x.min()).item() / 255)
    assert ((q.float() - zero_point) * scale - x).abs().max() <= scale / 2 + 1e-6
    # an all-positive input still has 0 in range (zero point 0): GELU outputs, padding
    q, scale, zero_point = quantize_activation(x.abs())
    assert zero_point == 0 and q.min() == 0 and scale == pytest.approx(x.abs().max().item() / 255)
    assert quantize_activation(torch.tensor([[1.0, float("nan")]])) is None


def test_weights_are_symmetric_per_output_channel():
    layer = _layer()
    int8 = Int8Linear.from_float(layer)
    assert int8.qweight.dtype == torch.int8 and int8.qweight.abs().max() <= 127
    torch.testing.assert_close(int8.weight_scale, layer.weight.abs().amax(1) / 127.5)
    error = (int8.dequantized_weight() - layer.weight).abs()
    assert (error <= int8.weight_scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("post_op", ["none", "gelu", "add"])
def test_outputs_equal_the_dequantised_arithmetic(post_op):
    """float32 outputs equal the reference to accumulation rounding (measured 2e-7 of the
    largest output): the kernel does exactly the quantised product, bias and epilogue."""
    layer = Int8Linear.from_float(_layer())
    x = torch.randn(2, 17, 96)
    residual = torch.randn(2, 17, 192)
    want = _reference(layer, x)
    if post_op == "gelu":
        want = F.gelu(want)
        got = layer.forward_fused(x, "gelu")
    elif post_op == "add":
        want = want + residual
        got = layer.forward_fused(x, residual=residual)
    else:
        got = layer(x)
    assert got.shape == (2, 17, 192) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_bf16_output_is_the_float32_output_rounded():
    layer = Int8Linear.from_float(_layer())
    x = torch.randn(31, 96)
    want = layer(x)
    got = layer.forward_fused(x, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5)


def test_at_least_as_close_to_float32_as_torch_quantize_dynamic():
    """The same scheme as torch's dynamic int8 Linear (per-channel symmetric weights, per-tensor
    uint8 inputs) on oneDNN's full uint8 range: measured max error 0.023 against torch's 0.041
    (its oneDNN dynamic kernel), on outputs up to 2.8."""
    layer = _layer()
    with warnings.catch_warnings(), precision._quantized_engine(precision.INT8_ENGINE):
        warnings.simplefilter("ignore")
        dynamic = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(layer), {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        )
    x = torch.randn(64, 96)
    with torch.no_grad():
        want = layer(x)
        theirs, ours = dynamic(x), Int8Linear.from_float(layer)(x)
    assert (ours - want).abs().max() <= (theirs - want).abs().max()
    assert (ours - want).abs().max() < 0.02 * want.abs().max()


def test_zero_input_gives_the_bias_and_nan_propagates():
    layer = Int8Linear.from_float(_layer())
    torch.testing.assert_close(layer(torch.zeros(3, 96)), layer.bias.expand(3, -1))
    x = torch.randn(3, 96)
    x[1, 5] = float("nan")
    out = layer(x)
    assert out[1].isnan().all() and out[[0, 2]].isfinite().all()
    x[1, 5] = float("inf")
    assert torch.equal(layer(x).isfinite(), F.linear(x, layer.dequantized_weight()).isfinite())


def test_loading_other_weights_packs_them_again():
    first, second = Int8Linear.from_float(_layer(seed=0)), Int8Linear.from_float(_layer(seed=1))
    x = torch.randn(4, 96)
    before = first(x)
    first.load_state_dict(second.state_dict())
    assert not torch.equal(first(x), before)
    torch.testing.assert_close(first(x), second(x), rtol=0, atol=0)
    assert set(first.state_dict()) == {"qweight", "weight_scale", "bias"}


def _model(init_values: float | None = None) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=96, depth=2, num_heads=3,
                              num_classes=10, init_values=init_values)  # fmt: skip
    return randomize(model)


def test_fused_int8_block_equals_the_same_layers_on_the_plain_path(monkeypatch):
    """The fused int8 block (GELU and residual adds in the epilogues) computes what
    `Block.forward` computes with the same int8 layers. In float32 here: with attention in bf16
    (native-bf16 CPUs) the next input's rounding to the uint8 grid moves some outputs by a
    whole step, so that path is held to agreeing with float32 (tests/model/test_precision.py)."""
    monkeypatch.setattr(onednn, "native_bf16", lambda: False)
    model = quantize_int8(_model())
    assert all(block.int8 for block in model.blocks)
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        assert model.blocks[0].fast_path_blocker(model.embed(x)) == ""
        fused = model(x)
        model.set_fast_path(False)
        plain = model(x)
    # rounding only: measured 3e-7 of the largest logit
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5 * plain.abs().max().item())


def test_blocks_that_do_not_fuse_run_the_same_layers_on_the_plain_path():
    """LayerScale keeps a block on the plain path, where `Int8Linear.forward` runs alone."""
    model = quantize_int8(_model(init_values=0.1))
    assert isinstance(model.blocks[0].mlp.fc2, Int8Linear) and isinstance(model.head, Int8Linear)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        assert model.blocks[0].fast_path_blocker(model.embed(x)) == (
            "ls1 is a LayerScale, not one the fused kernels implement (Identity)"
        )
        assert model(x).shape == (2, 10)


def test_nan_images_give_nan_logits_and_empty_batches_empty_ones():
    """As in float32: a non-finite input propagates (no range to quantise over), and a batch
    of none gives no logits, rather than an error from inside torch."""
    model = quantize_int8(_model())
    x = torch.randn(3, 3, 32, 32)
    x[1, 0, 5, 5] = float("nan")
    with torch.inference_mode():
        logits = model(x)
        assert logits[1].isnan().all() and logits[[0, 2]].isfinite().all()
        assert model(torch.empty(0, 3, 32, 32)).shape == (0, 10)


def test_an_int8_model_copies_and_its_state_dict_saves(tmp_path):
    """The oneDNN-packed weights are opaque tensors kept off the module: deepcopy and
    torch.save see only the int8 buffers, and a copy packs its own."""
    model = quantize_int8(_model())
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        want = model(x)
        twin = copy.deepcopy(model)
        assert torch.equal(twin(x), want)
    torch.save(model.state_dict(), tmp_path / "int8.pt")
    state = torch.load(tmp_path / "int8.pt", weights_only=True)
    assert state["blocks.0.attn.qkv.qweight"].dtype == torch.int8


def test_an_int8_model_under_bf16_autocast_stays_as_close_to_float32():
    """bf16 autocast over an int8 model: the fused blocks take bf16 inputs, the products stay
    int8; the logits are as close to float32's as without autocast."""
    reference = _model()
    model = quantize_int8(_model())
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = reference(x)
        with torch.autocast("cpu", torch.bfloat16):
            got = model(x)
    assert got.dtype == torch.float32
    # measured 2.2-2.9% of the largest logit over 5 inputs (without autocast 2.0-3.4%)
    torch.testing.assert_close(got, want, rtol=0, atol=0.1 * want.abs().max().item())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_int8_model_refuses_another_precision_and_takes_int8_again(precision):
    model = quantize_int8(_model())
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        want = model(x)
    assert set_precision(model, "int8") == "int8"  # nothing quantised twice
    with torch.inference_mode():
        assert torch.equal(model(x), want)
    message = f"^the model is int8-quantised and cannot run in {precision}; load the float "
    with pytest.raises(ValueError, match=message + "checkpoint again for fp32 or bf16$"):
        set_precision(model, precision)


def test_without_vnni_int8_falls_back_to_quantize_dynamic():
    """oneDNN's AVX2 / AVX-512 int8 kernels (no VNNI) sum pairs of products in int16 and
    saturate on full-range inputs: there `quantize_int8` takes torch's dynamic Linear, which
    agrees with float32. Run with oneDNN held to AVX2, as on such a CPU."""
    script = """
import torch
from torch import nn
from vitkit.model.onednn_int8 import int8_unsupported_reason
from vitkit.model.precision import quantize_int8
print(int8_unsupported_reason())
from vitkit import VisionTransformer
torch.manual_seed(0)
model = VisionTransformer(img_size=16, patch_size=4, embed_dim=64, depth=1, num_heads=2,
                          num_classes=10).eval()
for param in model.parameters():
    param.data.add_(torch.randn_like(param) * 0.05)
x = torch.randn(8, 3, 16, 16)
with torch.no_grad():
    want = model(x)
    quantize_int8(model)
    got = model(x)
print(type(model.head).__module__, float((got - want).abs().max() / want.abs().max()))
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    reason, module_and_error = done.stdout.strip().splitlines()[-2:]
    assert reason.startswith("oneDNN's int8 products saturate on this CPU (no VNNI or AMX")
    module, error = module_and_error.split()
    assert module.startswith("torch.ao.nn.quantized.dynamic")
    assert float(error) < 0.08  # measured 0.026
