"""bf16 training on CPU writes attention out rather than calling SDPA (whose CPU flash backward
is slow in bf16): the same function and gradients, chosen only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _helpers import randomize
from vitkit.model.layers import attention
from vitkit.model.layers.attention import Attention


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    return calls


def _run(layer: Attention, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """bf16 autocast forward and backward: the output and the input and weight gradients."""
    x = x.clone().requires_grad_()
    layer.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        out = layer(x)
    out.float().square().sum().backward()
    return out.float(), [x.grad, layer.qkv.weight.grad, layer.proj.weight.grad]


def test_bf16_training_writes_attention_out_with_sdpas_function(sdpa_calls, monkeypatch):
    torch.manual_seed(0)
    layer = randomize(Attention(64, num_heads=4)).train()
    x = torch.randn(3, 50, 64)
    out, grads = _run(layer, x)
    assert sdpa_calls == []
    monkeypatch.setattr(attention, "bf16_cpu_training", lambda q: False)
    want, want_grads = _run(layer, x)
    assert len(sdpa_calls) == 1
    # both bf16: measured 6.0e-3 (output) and up to 6.5e-3 (gradients) of the largest value
    scale = want.abs().max().item()
    torch.testing.assert_close(out, want, rtol=0, atol=2e-2 * scale)
    for got, expected in zip(grads, want_grads):
        tolerance = 3e-2 * expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=0, atol=tolerance)


@pytest.mark.parametrize("case", ["inference", "float32", "many tokens", "not fused"])
def test_elsewhere_attention_is_unchanged(case, sdpa_calls):
    layer = Attention(64, num_heads=4).train()
    tokens = 700 if case == "many tokens" else 50  # over the 640-token limit
    x = torch.randn(1, tokens, 64)
    if case == "not fused":
        layer.fused_attn = False
    if case == "float32":
        layer(x).sum().backward()
    else:
        with torch.autocast("cpu", torch.bfloat16), torch.set_grad_enabled(case != "inference"):
            layer(x)
    assert len(sdpa_calls) == (0 if case == "not fused" else 1)


def test_attention_dropout_still_applies_in_bf16_training():
    torch.manual_seed(0)
    layer = Attention(32, num_heads=2, attn_drop=0.5).train()
    x = torch.randn(2, 20, 32, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        first, second = layer(x), layer(x)
        layer.eval()
        third, fourth = layer(x), layer(x)
    assert not torch.equal(first, second)  # fresh masks
    assert torch.equal(third, fourth)


def test_swin_window_attention_in_bf16_training_is_written_out_too(monkeypatch):
    """Swin's version-1 window attention, shifted windows' mask included: SDPA's masked CPU
    backward in bf16 ran 5-7x the written-out attention at Swin-T's shapes."""
    from vitkit.model.swin import attention as swin_attention

    calls = []
    original = F.scaled_dot_product_attention
    monkeypatch.setattr(swin_attention.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))  # fmt: skip
    torch.manual_seed(0)
    layer = randomize(swin_attention.WindowAttention(32, num_heads=2, window=(4, 4))).train()
    with torch.no_grad():
        layer.relative_position_bias_table.normal_(0, 0.5)
    mask = torch.zeros(4, 16, 16)
    mask[1:, :8, 8:] = mask[1:, 8:, :8] = -100.0  # windows across the shift's seam
    x = torch.randn(8, 16, 32)  # 2 images x 4 windows

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        inputs = x.clone().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16):
            out = layer(inputs, mask)
        out.float().square().sum().backward()
        return out.float(), inputs.grad

    out, grad = run()
    assert calls == []
    monkeypatch.setattr(swin_attention, "bf16_cpu_training", lambda q: False)
    want, want_grad = run()
    assert calls == [1]
    # both bf16: measured 5.1e-3 (output) and 5.8e-3 (input gradient) of the largest value
    torch.testing.assert_close(out, want, rtol=0, atol=2e-2 * want.abs().max().item())
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=2e-2 * want_grad.abs().max().item())
