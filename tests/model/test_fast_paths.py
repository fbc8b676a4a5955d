"""Every fast path computes what the plain path computes.

Tolerances: float32 paths agree within 1e-5 absolute on outputs of order 1 (the kernels sum in
different orders); bfloat16 within 3e-2 (8 mantissa bits); gradient checkpointing replays the
same kernels, so its gradients match within 1e-6.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.model.layers import Attention, Block, Linear
from vitkit.summary import flop_counter

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def tiny(**overrides) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    return vitkit.VisionTransformer(**{**TINY, **overrides}).eval()


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """Counts calls of Block.forward_fused, the fused inference path."""
    calls: list[int] = []
    original = Block.forward_fused

    def spy(self, x):
        calls.append(1)
        return original(self, x)

    monkeypatch.setattr(Block, "forward_fused", spy)
    return calls


def images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def plain_output(model: vitkit.VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    model.set_fast_path(False)
    with torch.inference_mode():
        out = model(x)
    model.set_fast_path(True)
    return out


# -- fused SDPA attention --------------------------------------------------------------------


@pytest.mark.parametrize("qk_scale", [None, 0.5])
def test_sdpa_matches_explicit_attention(qk_scale):
    torch.manual_seed(0)
    attn = Attention(64, num_heads=4, qk_scale=qk_scale)
    x = torch.randn(2, 17, 64)
    fused = attn(x)
    attn.fused_attn = False
    explicit = attn(x)
    with_weights, weights = attn.forward_with_weights(x)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    torch.testing.assert_close(with_weights, explicit, atol=0, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 17), atol=1e-6, rtol=0)


# -- the fused inference path ----------------------------------------------------------------


@pytest.mark.parametrize("grad_off", [torch.inference_mode, torch.no_grad])
@pytest.mark.parametrize("num_heads", [4, 1])
def test_fused_inference_matches_plain_path(fused_calls, grad_off, num_heads):
    model = tiny(num_heads=num_heads)
    x = images()
    with grad_off():
        fast = model(x)
    assert len(fused_calls) == 2  # both blocks took it
    torch.testing.assert_close(fast, plain_output(model, x), atol=1e-5, rtol=0)
    assert len(fused_calls) == 2  # and set_fast_path(False) kept it off


@pytest.mark.parametrize(
    "overrides", [dict(qk_scale=0.3), dict(drop_path_rate=0.5, drop_rate=0.2), dict(qkv_bias=False)]
)
def test_fused_inference_covers_scale_bias_and_eval_dropout(fused_calls, overrides):
    model = tiny(**overrides)
    x = images()
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    torch.testing.assert_close(fast, plain_output(model, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("in_epilogue", [True, False])
def test_fused_gelu_in_the_epilogue_or_in_place_matches_plain_path(monkeypatch, in_epilogue):
    from vitkit.model import layers

    monkeypatch.setattr(layers, "GELU_IN_EPILOGUE", in_epilogue)
    torch.manual_seed(0)
    fc1, x = Linear(64, 256), torch.randn(3, 17, 64)
    with torch.inference_mode():
        torch.testing.assert_close(layers._linear_gelu(x, fc1), F.gelu(fc1(x)), atol=1e-5, rtol=0)
    model = tiny()
    with torch.inference_mode():
        fast = model(images())
    torch.testing.assert_close(fast, plain_output(model, images()), atol=1e-5, rtol=0)


def test_fused_slices_keep_each_slice_under_the_byte_budget(monkeypatch):
    from vitkit.model import layers

    # ViT-B/16 and ViT-S/16 at batch 32, fp32: 197 tokens, MLP hidden 3072 / 1536.
    assert layers.fused_slices(32, 197, 3072, 4) == 4
    assert layers.fused_slices(32, 197, 1536, 4) == 2
    assert layers.fused_slices(32, 197, 768, 4) == 1
    assert layers.fused_slices(32, 197, 3072, 2) == 2  # bfloat16 halves the bytes
    assert layers.fused_slices(1, 4097, 5120, 4) == 1  # never less than one image
    monkeypatch.setattr(layers, "FUSED_SLICE_BYTES", 17 * 256 * 4)  # one image's hidden layer
    assert layers.fused_slices(3, 17, 256, 4) == 3


def test_sliced_batches_match_the_plain_path(monkeypatch):
    from vitkit.model import layers

    model, x = tiny(), images(5)
    whole = plain_output(model, x)
    monkeypatch.setattr(layers, "FUSED_SLICE_BYTES", 2 * 17 * 256 * 4)  # two images a slice
    assert layers.fused_slices(5, 17, 256, 4) == 3
    sizes: list[int] = []
    original = Block._fused_slice
    monkeypatch.setattr(
        Block, "_fused_slice", lambda self, part: sizes.append(len(part)) or original(self, part)
    )
    with torch.inference_mode():
        sliced = model(x)
    assert sizes == [2, 2, 1] * 2  # three slices in each of the two blocks
    torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=0)
    for index in range(5):  # each image as if it ran alone
        with torch.inference_mode():
            alone = model(x[index : index + 1])
        torch.testing.assert_close(sliced[index : index + 1], alone, atol=1e-5, rtol=0)


def test_layer_scale_falls_back_to_plain_path(fused_calls):
    model = tiny(init_values=0.1)
    x = images()
    with torch.inference_mode():
        out = model(x)
        tokens = model.embed(x)
        assert model.blocks[0].fast_path_blocker(tokens) == "LayerScale is not fused"
    assert fused_calls == []  # (the Linear layers' oneDNN products sum in another order)
    torch.testing.assert_close(out, plain_output(model, x), atol=1e-5, rtol=0)


def test_blockers_name_the_reason():
    model = tiny()
    block = model.blocks[0]
    x = torch.randn(2, 17, 64)
    with torch.inference_mode():
        assert block.fast_path_blocker(x) == ""
        model.set_fast_path(False)
        assert block.fast_path_blocker(x) == "the fast path is switched off (fast_path = False)"
        model.set_fast_path(True)
        block.attn.fused_attn = False
        assert block.fast_path_blocker(x) == (
            "attn.fused_attn is False (explicit attention requested)"
        )
        block.attn.fused_attn = True
        assert "does not match" in block.fast_path_blocker(x.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert block.fast_path_blocker(x) == "autocast is enabled"
        with FlopCounterMode(display=False):
            assert block.fast_path_blocker(x) == "a dispatch mode or tensor subclass is active"
    assert block.fast_path_blocker(x) == (
        "grad is enabled; run under torch.inference_mode() or torch.no_grad()"
    )
    model.train()
    with torch.inference_mode():
        assert block.fast_path_blocker(x) == "the block is in training mode"


def test_hooks_see_every_layer(fused_calls):
    model = tiny()
    seen: list[tuple[int, ...]] = []
    handle = model.blocks[1].mlp.fc1.register_forward_hook(
        lambda module, args, out: seen.append(tuple(out.shape))
    )
    x = images()
    with torch.inference_mode():
        out = model(x)
    assert seen == [(3, 17, 256)]
    assert len(fused_calls) == 1  # block 0 has no hooks and stays fused
    handle.remove()
    torch.testing.assert_close(out, plain_output(model, x), atol=1e-5, rtol=0)


def test_attention_maps_and_training_use_plain_path(fused_calls):
    model = tiny()
    x = images()
    with torch.inference_mode():
        logits, maps = model(x, return_attention=True)
    assert [tuple(m.shape) for m in maps] == [(3, 4, 17, 17)] * 2
    model.train()
    model(x).sum().backward()
    assert fused_calls == []
    model.eval()
    torch.testing.assert_close(logits, plain_output(model, x), atol=1e-5, rtol=0)


def test_flop_counts_and_summary_are_unchanged_by_the_fast_path():
    model = tiny()
    x = images(1)
    counts = []
    for enabled in (True, False):
        model.set_fast_path(enabled)
        with torch.inference_mode(), flop_counter() as counter:
            model(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0
    model.set_fast_path(True)
    table = vitkit.summary(model, (1, 3, 32, 32), max_depth=4)
    assert table.total_flops == counts[0]
    assert "fc1" in {row.name.split(".")[-1] for row in table.rows}


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no bf16 oneDNN kernels on this CPU"
)
def test_fused_inference_in_bfloat16(fused_calls):
    model = tiny().to(torch.bfloat16)
    x = images().to(torch.bfloat16)
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    torch.testing.assert_close(fast, plain_output(model, x), atol=3e-2, rtol=3e-2)


# -- packed weights ----------------------------------------------------------------------------


def fused(model: vitkit.VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


def test_packed_weights_follow_every_change_of_the_weights(fused_calls):
    from vitkit.model.layers import _PACKED

    model, x = tiny(), images()
    fused(model, x)
    fc1 = model.blocks[0].mlp.fc1
    assert fc1 in _PACKED and list(model.state_dict()) == list(tiny().state_dict())
    with torch.no_grad():  # an in-place update (an optimiser step, a manual edit)
        fc1.weight.mul_(2.0)
    torch.testing.assert_close(fused(model, x), plain_output(model, x), atol=1e-5, rtol=0)
    torch.manual_seed(1)
    other = vitkit.VisionTransformer(**TINY)
    model.load_state_dict(other.state_dict())  # other weights, copied in place
    torch.testing.assert_close(fused(model, x), plain_output(model, x), atol=1e-5, rtol=0)
    fc1.weight = torch.nn.Parameter(fc1.weight.detach() * 0.5)  # a new tensor
    torch.testing.assert_close(fused(model, x), plain_output(model, x), atol=1e-5, rtol=0)
    assert len(fused_calls) == 4 * 2  # four fused forwards of two blocks


def test_packed_weights_leave_copies_alone_and_are_freed_with_the_fast_path():
    import copy

    from vitkit.model.layers import _PACKED

    model, x = tiny(), images()
    expected = fused(model, x)
    twin = copy.deepcopy(model)  # a used model copies (the packs are not module state)
    with torch.no_grad():
        twin.blocks[1].attn.qkv.weight.zero_()
    assert not torch.allclose(fused(twin, x), expected)
    torch.testing.assert_close(fused(model, x), expected, atol=0, rtol=0)
    model.set_fast_path(False)
    assert not any(layer in _PACKED for layer in model.modules())


# -- oneDNN Linear ---------------------------------------------------------------------------


def onednn_everywhere(model: vitkit.VisionTransformer) -> vitkit.VisionTransformer:
    """The tiny model's layers are narrower than Linear.min_features: lift the limit."""
    for layer in model.modules():
        if isinstance(layer, Linear):
            layer.min_features = 0
    return model


def onednn_used(out: torch.Tensor) -> bool:
    return type(out.grad_fn).__name__ == "_OneDNNLinearBackward"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 12), (3, 5, 12), "strided"])
def test_onednn_linear_matches_f_linear_and_its_gradients(bias, shape):
    torch.manual_seed(0)
    layer = Linear(12, 9, bias=bias)
    layer.min_features = 0  # small enough to check exactly
    if shape == "strided":  # a transposed view, as a permuted activation would be
        x = torch.randn(5, 3, 12).transpose(0, 1).requires_grad_()
    else:
        x = torch.randn(*shape, requires_grad=True)
    out = layer(x)
    assert onednn_used(out)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *layer.parameters()], grad)
    ref_out = F.linear(x, layer.weight, layer.bias)
    expected = torch.autograd.grad(ref_out, [x, *layer.parameters()], grad)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=0)


def test_onednn_linear_under_no_grad_and_with_frozen_weights():
    torch.manual_seed(0)
    layer, x = Linear(256, 192), torch.randn(4, 256)
    expected = F.linear(x, layer.weight, layer.bias)
    for grad_off in (torch.inference_mode, torch.no_grad):
        with grad_off():
            torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=0)
    layer.requires_grad_(False)  # a frozen layer still passes gradients to its input
    x.requires_grad_()
    out = layer(x)
    assert onednn_used(out)
    (grad_x,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad_x, layer.weight.sum(0).expand(4, -1), atol=1e-5, rtol=0)


def test_onednn_linear_is_deterministic():
    torch.manual_seed(0)
    layer, x = Linear(256, 320), torch.randn(3, 50, 256, requires_grad=True)
    grad = torch.randn(3, 50, 320)
    runs = [torch.autograd.grad(layer(x), [x, layer.weight], grad) for _ in range(2)]
    assert onednn_used(layer(x))
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)


def test_onednn_linear_supports_a_second_derivative():
    torch.manual_seed(0)
    layer = Linear(6, 4)
    layer.min_features = 0
    x = torch.randn(3, 6, requires_grad=True)
    penalties = []
    for fast in (True, False):  # a gradient penalty: d/dW of |d out / d x|^2
        layer.fast_path = fast
        (grad_x,) = torch.autograd.grad(layer(x).tanh().sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(grad_x.pow(2).sum(), layer.weight)[0])
    torch.testing.assert_close(penalties[0], penalties[1], atol=1e-5, rtol=0)


def test_onednn_linear_steps_aside_for_what_must_see_or_trace_the_product():
    layer, x = Linear(8, 4), torch.randn(2, 8, requires_grad=True)
    assert not onednn_used(layer(x))  # narrower than min_features
    layer.min_features = 4
    assert onednn_used(layer(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_used(layer(x)) and layer(x).dtype == torch.bfloat16
    with FlopCounterMode(display=False) as counter:
        layer(x)
    assert counter.get_total_flops() == 2 * 2 * 8 * 4
    assert not onednn_used(layer.double()(x.double()))
    layer.float().fast_path = False
    assert not onednn_used(layer(x))


def test_training_gradients_match_the_plain_path():
    model, x, y = onednn_everywhere(tiny().train()), images(4), torch.tensor([0, 1, 2, 3])
    kernels: list[bool] = []
    for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
        model.blocks[1].get_submodule(name).register_forward_hook(
            lambda module, args, out: kernels.append(onednn_used(out))
        )
    grads = []
    for fast in (True, False):
        model.set_fast_path(fast)
        model.zero_grad()
        torch.manual_seed(0)
        F.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert kernels == [True] * 4 + [False] * 4
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=0, msg=name)


# -- gradient checkpointing ------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, dict(drop_path_rate=0.3, drop_rate=0.1)])
def test_grad_checkpointing_gives_the_same_gradients(overrides):
    model = onednn_everywhere(tiny(**overrides).train())
    x, y = images(4), torch.tensor([0, 1, 2, 3])
    grads = []
    for enabled in (False, True):
        model.set_grad_checkpointing(enabled)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(2)  # the same dropout masks in both runs
        F.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=0, msg=name)


# -- torch.compile ---------------------------------------------------------------------------


@pytest.mark.slow
def test_compile_fullgraph_inference_matches_eager():
    model = tiny()
    x = images()
    compiled = torch.compile(model, fullgraph=True)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), plain_output(model, x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_compile_fullgraph_training_step_has_no_graph_breaks():
    model = tiny(drop_path_rate=0.1).train()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, y = images(2), torch.tensor([0, 1])
    F.cross_entropy(compiled(x), y).backward()
    assert all(p.grad is not None for p in model.parameters())
