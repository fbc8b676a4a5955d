"""Every fast path computes what the plain path computes, on random weights (`tiny`: biases,
norms and LayerScale far from their initial zeros and ones, so dropping one is caught).

Tolerances, from measurement (2-core AVX-512 CPU): the float32 fused path and oneDNN products
differ from the plain path by at most 2e-7 on outputs of magnitude 0.3-2 (most are
bit-identical here), 1.6e-6 for 256-wide products; tolerance 1e-5 absolute, room for CPUs whose
kernels sum in another order. bfloat16: measured 6e-3 on logits up to 0.46, tolerance 1.5e-2.
Gradient checkpointing replays the same kernels: measured 0, tolerance 1e-6.
"""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from _helpers import randomize, requires_onednn, requires_timm, requires_torchvision, timm_fx_model
from vitkit.model import onednn_fused, onednn_support
from vitkit.model.layers import Attention, Block
from vitkit.model.onednn_support import native_bf16
from vitkit.model.vit import onednn
from vitkit.model.vit.onednn import OneDNNBlock, OneDNNLinear
from vitkit.options import default_of, kinds, option_fields
from vitkit.summary import flop_counter

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def tiny(**overrides) -> vitkit.VisionTransformer:
    """The tiny model on random weights (biases, norms and any LayerScale far from their
    initial zeros and ones, so a fast path that drops one of them is caught), in eval mode."""
    torch.manual_seed(0)
    return randomize(vitkit.VisionTransformer(**{**TINY, **overrides}))


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """Counts calls of OneDNNBlock.forward_fused, the fused inference path."""
    if onednn.unsupported_reason():
        pytest.skip(onednn.unsupported_reason())
    calls: list[int] = []
    original = OneDNNBlock.forward_fused

    def spy(self, x):
        calls.append(1)
        return original(self, x)

    monkeypatch.setattr(OneDNNBlock, "forward_fused", spy)
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


@pytest.mark.parametrize("in_epilogue", [True, False])
def test_fused_gelu_in_the_epilogue_or_in_place_matches_plain_path(fused_calls, in_epilogue):
    torch.manual_seed(0)
    fc1, x = nn.Linear(64, 256), torch.randn(3, 17, 64)
    with torch.inference_mode():
        fused_gelu = onednn_fused.linear_gelu(x, fc1, in_epilogue)
        torch.testing.assert_close(fused_gelu, F.gelu(fc1(x)), atol=1e-5, rtol=0)
    model = tiny()
    assert onednn.enable_fast_path(model, gelu_in_epilogue=in_epilogue)
    assert [block.gelu_in_epilogue for block in model.blocks] == [in_epilogue] * 2
    with torch.inference_mode():
        fast = model(images())
    assert len(fused_calls) == 2
    torch.testing.assert_close(fast, plain_output(model, images()), atol=1e-5, rtol=0)


def test_fused_slices_keep_each_slice_under_the_byte_budget():
    budget = onednn.SLICE_BYTES
    assert budget == 24 * 2**20
    # ViT-B/16 and ViT-S/16 at batch 32, fp32: 197 tokens, MLP hidden 3072 / 1536.
    assert onednn.fused_slices(32, 197, 3072, 4, budget) == 4
    assert onednn.fused_slices(32, 197, 1536, 4, budget) == 2
    assert onednn.fused_slices(32, 197, 768, 4, budget) == 1
    assert onednn.fused_slices(32, 197, 3072, 2, budget) == 2  # bfloat16 halves the bytes
    assert onednn.fused_slices(1, 4097, 5120, 4, budget) == 1  # never less than one image
    assert onednn.fused_slices(3, 17, 256, 4, 17 * 256 * 4) == 3  # one image's hidden layer


@requires_onednn
def test_sliced_batches_match_the_plain_path(monkeypatch):
    model, x = tiny(), images(5)
    whole = plain_output(model, x)
    budget = 2 * 17 * 256 * 4  # two images a slice
    assert onednn.enable_fast_path(model, slice_bytes=budget)
    assert [block.slice_bytes for block in model.blocks] == [budget] * 2
    assert onednn.fused_slices(5, 17, 256, 4, budget) == 3
    sizes: list[int] = []
    original = OneDNNBlock._fused_slice
    monkeypatch.setattr(
        OneDNNBlock,
        "_fused_slice",
        lambda self, part: sizes.append(len(part)) or original(self, part),
    )
    with torch.inference_mode():
        sliced = model(x)
    assert sizes == [2, 2, 1] * 2  # three slices in each of the two blocks
    torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=0)
    for index in range(5):  # each image as if it ran alone
        with torch.inference_mode():
            alone = model(x[index : index + 1])
        torch.testing.assert_close(sliced[index : index + 1], alone, atol=1e-5, rtol=0)


# -- the allow-list: every option of the schema, and layers the fused kernels do not know ------

# ViTamin's stem at its smallest: one stage, of one block (3 halvings: 4 x 4 tokens).
_MBCONV = dict(hybrid="mbconv", hybrid_layers=(1,), hybrid_widths=(8,), patch_size=1)
# What a value needs beside it, as ViTConfig's checks ask (the tiny model has 4 x 4 patches).
NEEDS: dict[str, dict] = {
    "class_token": dict(global_pool="avg"),
    "pool_include_prefix": dict(global_pool="avg"),
    "dynamic_img_pad": dict(dynamic_img_size=True),
    "conv_stem_strides": dict(conv_stem=(16,)),
    "hybrid_layers": dict(hybrid="resnetv2"),
    "hybrid_widths": _MBCONV,
    "window_size": dict(class_token=False, global_pool="avg"),
    "global_blocks": dict(window_size=2, class_token=False, global_pool="avg"),
    "use_rel_pos": dict(class_token=False, global_pool="avg"),
    "rel_pos_img_size": dict(use_rel_pos=True, class_token=False, global_pool="avg"),
}
# What one value of an option needs beside it.
VALUE_NEEDS: dict[tuple[str, object], dict] = {("hybrid", "mbconv"): _MBCONV}
# Numbers the generic rule below cannot pick (None by default, and no range to read one from).
VALUES: dict[str, object] = {"rel_pos_img_size": 64}


def non_default_values(name: str, default: object) -> list[object]:
    """Values of ViTConfig option `name` other than `default` (the tiny model's): every other
    choice, the other boolean(s), a number the option's range admits."""
    field = option_fields(vitkit.ViTConfig)[name]
    kind = kinds(vitkit.ViTConfig)[name]
    if name in VALUES:
        return [VALUES[name]]
    if field.metadata["choices"] is not None:
        return [choice for choice in field.metadata["choices"] if choice != default]
    if kind.has(bool):
        return [value for value in (True, False) if value != default]
    if kind.has(tuple) and default == ():
        low = field.metadata["range"].low
        return [(int(low),)]
    if kind.has(int) or kind.has(float):
        if default is None:
            return [0.5]
        if default == 0:
            return [0.25 if kind.has(float) else 1]
        return [default / 2 if isinstance(default, float) else default * 2]
    return []


def schema_cases() -> list:
    """One case per non-default value of every ViTConfig option with choices, a boolean or a
    number: a new option becomes a case without anyone listing it."""
    cases = [pytest.param({}, id="default")]
    for name in option_fields(vitkit.ViTConfig):
        default = TINY.get(name, default_of(vitkit.ViTConfig, name))
        for value in non_default_values(name, default):
            options = {**NEEDS.get(name, {}), **VALUE_NEEDS.get((name, value), {}), name: value}
            cases.append(pytest.param(options, id=f"{name}={value}"))
    return cases


def test_every_option_of_the_schema_is_a_case():
    names = {name for case in schema_cases() for name in case.values[0]}
    assert names == set(option_fields(vitkit.ViTConfig))


def block_layers(block: nn.Module) -> list[tuple[str, type, str]]:
    """The layers of a block as the fused kernels would see them: names, classes, settings."""
    return [(name, type(m), m.extra_repr()) for name, m in block.named_modules()]


@pytest.mark.parametrize("options", schema_cases())
def test_each_option_fuses_exactly_where_it_computes_the_same(fused_calls, options):
    """The fused path equals the plain path for every option; it runs in every block whose
    layers are the fused kernels' (the default's, or any the allow-list takes), and every
    block it leaves names why."""
    model = tiny(**options)
    config = model.config
    height, width = (config.img_size,) * 2 if isinstance(config.img_size, int) else config.img_size
    x = torch.randn(3, config.in_chans, height, width, generator=torch.Generator().manual_seed(1))
    default_block = block_layers(tiny().blocks[0])
    blocks = [block for block in model.modules() if isinstance(block, OneDNNBlock)]
    reasons = [onednn.unfused_layer(block) for block in blocks]
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == reasons.count("")  # each block the allow-list takes fused once
    for block, reason in zip(blocks, reasons, strict=True):
        if block_layers(block) == default_block:
            assert reason == ""  # an option the blocks do not see keeps the fast path
    if options == {}:
        assert len(fused_calls) == TINY["depth"]
    # measured at most 2.4e-7 on outputs of magnitude 0.3-2 (most cases bit-identical)
    torch.testing.assert_close(fast, plain_output(model, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_base_patch16_224"])
def test_the_default_presets_take_the_fused_kernels(fused_calls, name):
    """ViT-S/16 and ViT-B/16, as before the allow-list: every block fused, every product on
    oneDNN (packed weights), the plain path's output."""
    torch.manual_seed(0)
    model = randomize(vitkit.create_model(name, depth=2))
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    assert all(block.attn.qkv in onednn._PACKED for block in model.blocks)
    torch.testing.assert_close(fast, plain_output(model, x), atol=1e-5, rtol=0)


class RotaryAttention(Attention):
    """An attention variant the fused kernels do not know: mixes the channels of the queries
    before attending (a stand-in for rotary positions)."""

    def _qkv(self, x):
        q, k, v = super()._qkv(x)
        return q.flip(-1), k, v


class Wrapper(nn.Module):
    """A module wrapped around a layer: an adapter that scales its output."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 1.5 * self.inner(x)


class ScaledLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return 2 * super().forward(x)


def swap_attention(block: OneDNNBlock) -> None:
    attn = RotaryAttention(64, num_heads=4)
    attn.load_state_dict(block.attn.state_dict())
    block.attn = attn.eval()


def add_module(block: OneDNNBlock) -> None:
    block.attn.rope = nn.Identity()


def wrap_fc1(block: OneDNNBlock) -> None:
    block.mlp.fc1 = Wrapper(block.mlp.fc1)


def subclass_norm(block: OneDNNBlock) -> None:
    norm = ScaledLayerNorm(64, eps=1e-6)
    norm.load_state_dict(block.norm2.state_dict())
    block.norm2 = norm.eval()


def own_forward(block: OneDNNBlock) -> None:
    act = block.mlp.act
    act.forward = lambda x: F.gelu(x) * 0.5


SUBSTITUTIONS = [
    pytest.param(swap_attention, "attn is a RotaryAttention, not one the fused kernels "
                 "implement (Attention)", id="attention-subclass"),
    pytest.param(add_module, "attn.rope (Identity) is not a layer the fused kernels implement",
                 id="new-sub-module"),
    pytest.param(wrap_fc1, "mlp.fc1 is a Wrapper, not one the fused kernels implement (Linear, "
                 "OneDNNLinear, Int8Linear)", id="wrapper"),
    pytest.param(subclass_norm, "norm2 is a ScaledLayerNorm, not one the fused kernels "
                 "implement (LayerNorm, RMSNorm)", id="norm-subclass"),
    pytest.param(own_forward, "mlp.act has a forward of its own (set on the instance)",
                 id="instance-forward"),
]  # fmt: skip


@pytest.mark.parametrize("substitute, reason", SUBSTITUTIONS)
def test_a_layer_the_fused_kernels_do_not_know_runs_the_plain_path(fused_calls, substitute, reason):
    model, x = tiny(), images()
    with torch.inference_mode():
        before = model(x)
        substitute(model.blocks[1])
        tokens = model.blocks[0](model.embed(x))
        assert model.blocks[1].fast_path_blocker(tokens) == reason
        assert onednn.unfused_layer(model.blocks[1]) == reason
        fused_calls.clear()
        out = model(x)
    assert len(fused_calls) == 1  # block 0 only
    plain = plain_output(model, x)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=0)
    if substitute is not add_module:  # the new layer computes something else, and it ran
        assert (out - before).abs().max() > 1e-3


@requires_onednn
def test_a_missing_slot_or_a_sub_module_in_training_is_named():
    block = tiny().blocks[0]
    assert onednn.unfused_layer(block) == ""
    block.mlp.drop1.train()
    assert onednn.unfused_layer(block) == "mlp.drop1 is in training mode"
    block.mlp.drop1.eval()
    del block.mlp.drop2
    assert onednn.unfused_layer(block) == "mlp.drop2 is missing"


def test_layer_scale_falls_back_to_plain_path(fused_calls):
    model = tiny(init_values=0.1)
    x = images()
    with torch.inference_mode():
        out = model(x)
        tokens = model.embed(x)
        assert model.blocks[0].fast_path_blocker(tokens) == (
            "ls1 is a LayerScale, not one the fused kernels implement (Identity)"
        )
    assert fused_calls == []  # (the Linear layers' oneDNN products sum in another order)
    torch.testing.assert_close(out, plain_output(model, x), atol=1e-5, rtol=0)


@requires_onednn
def test_blockers_name_the_reason():
    model = tiny()
    block = model.blocks[0]
    x = torch.randn(2, 17, 64)
    with torch.inference_mode():
        assert block.fast_path_blocker(x) == ""
        model.set_fast_path(False)  # a flag: the same block, of the same class
        assert block.fast_path_blocker(x) == "the fast path is switched off (set_fast_path(False))"
        model.set_fast_path(True)
        assert type(block) is OneDNNBlock and block is model.blocks[0]
        block.attn.fused_attn = False
        assert block.fast_path_blocker(x) == (
            "attn.fused_attn is False (explicit attention requested)"
        )
        block.attn.fused_attn = True
        assert "does not match" in block.fast_path_blocker(x.double())
        with torch.autocast("cpu", dtype=torch.float16):
            assert block.fast_path_blocker(x).startswith("autocast to torch.float16 over")
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
    bool(onednn.unsupported_reason()) or not native_bf16(),
    reason="no bf16 oneDNN kernels on this CPU",
)
def test_fused_inference_in_bfloat16(fused_calls):
    model = tiny().to(torch.bfloat16)
    x = images().to(torch.bfloat16)
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    # measured 6.0e-3 on logits up to 0.46 (bf16 rounds to 8 bits); tolerance 2.5x that
    torch.testing.assert_close(fast, plain_output(model, x), atol=1.5e-2, rtol=0)


# -- packed weights ----------------------------------------------------------------------------


def fused(model: vitkit.VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


def test_packed_weights_follow_every_change_of_the_weights(fused_calls):
    from vitkit.model.vit.onednn import _PACKED

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


@requires_onednn
def test_packed_weights_leave_copies_alone_and_are_freed_with_the_fast_path():
    from vitkit.model.vit.onednn import _PACKED

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
    """The tiny model's layers are narrower than onednn.MIN_FEATURES: lift the limit."""
    onednn.enable_fast_path(model, min_features=0)
    return model


def onednn_used(out: torch.Tensor) -> bool:
    return type(out.grad_fn).__name__ == "_InnerProductBackward"


@requires_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 12), (3, 5, 12), "strided"])
def test_onednn_linear_matches_f_linear_and_its_gradients(bias, shape):
    torch.manual_seed(0)
    layer = OneDNNLinear(12, 9, bias=bias)
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


@requires_onednn
def test_onednn_linear_under_no_grad_and_with_frozen_weights():
    torch.manual_seed(0)
    layer, x = OneDNNLinear(256, 192), torch.randn(4, 256)
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


@requires_onednn
def test_onednn_linear_is_deterministic():
    torch.manual_seed(0)
    layer, x = OneDNNLinear(256, 320), torch.randn(3, 50, 256, requires_grad=True)
    grad = torch.randn(3, 50, 320)
    runs = [torch.autograd.grad(layer(x), [x, layer.weight], grad) for _ in range(2)]
    assert onednn_used(layer(x))
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)


@requires_onednn
def test_onednn_linear_supports_a_second_derivative():
    torch.manual_seed(0)
    layer = OneDNNLinear(6, 4)
    layer.min_features = 0
    x = torch.randn(3, 6, requires_grad=True)
    penalties = []
    for fast in (True, False):  # a gradient penalty: d/dW of |d out / d x|^2
        if not fast:
            onednn.disable_fast_path(layer)
            assert type(layer) is OneDNNLinear and not layer.fast_path
        out = layer(x)
        assert onednn_used(out) == fast
        (grad_x,) = torch.autograd.grad(out.tanh().sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(grad_x.pow(2).sum(), layer.weight)[0])
    torch.testing.assert_close(penalties[0], penalties[1], atol=1e-5, rtol=0)


@requires_onednn
def test_onednn_linear_steps_aside_for_what_must_see_or_trace_the_product():
    layer, x = OneDNNLinear(8, 4), torch.randn(2, 8, requires_grad=True)
    assert not onednn_used(layer(x))  # narrower than min_features
    layer.min_features = 4
    assert onednn_used(layer(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_used(layer(x)) and layer(x).dtype == torch.bfloat16
    with FlopCounterMode(display=False) as counter:
        layer(x)
    assert counter.get_total_flops() == 2 * 2 * 8 * 4
    assert not onednn_used(layer.double()(x.double()))
    onednn.disable_fast_path(layer.float())
    assert not layer.fast_path and not onednn_used(layer(x))
    onednn.enable_fast_path(layer, min_features=4)
    assert onednn_used(layer(x))


@requires_onednn
def test_training_gradients_match_the_plain_path():
    model, x, y = tiny().train(), images(4), torch.tensor([0, 1, 2, 3])
    kernels: list[bool] = []
    for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
        model.blocks[1].get_submodule(name).register_forward_hook(
            lambda module, args, out: kernels.append(onednn_used(out))
        )
    grads = []
    for fast in (True, False):
        onednn.enable_fast_path(model, fast, min_features=0)
        model.zero_grad()
        torch.manual_seed(0)
        F.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert kernels == [True] * 4 + [False] * 4
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=0, msg=name)


# -- the switch: enable_fast_path / disable_fast_path ------------------------------------------


PROJECTIONS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def fast_path_log(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == onednn_fused.__name__]


@requires_onednn
def test_a_new_model_has_the_fast_path_with_todays_defaults():
    model = tiny()
    blocks = list(model.blocks)
    assert [type(block) for block in blocks] == [OneDNNBlock] * 2
    linears = [block.get_submodule(name) for block in blocks for name in PROJECTIONS]
    assert [type(layer) for layer in linears] == [OneDNNLinear] * 8
    assert all(layer.min_features == 192 for layer in linears)
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert [block.gelu_in_epilogue for block in blocks] == [avx512] * 2
    assert [block.slice_bytes for block in blocks] == [24 * 2**20] * 2
    assert type(model.head) is nn.Linear and type(model.patch_embed.proj) is nn.Conv2d
    assert isinstance(blocks[0], Block) and isinstance(linears[0], nn.Linear)


@requires_onednn
def test_enable_and_disable_log_one_line_each(caplog):
    caplog.set_level(logging.DEBUG, logger=onednn_fused.__name__)
    model = tiny()
    (record,) = fast_path_log(caplog)
    assert record.levelno == logging.DEBUG
    assert record.getMessage().startswith("oneDNN fast path in 2 blocks and 8 Linear layers")
    caplog.clear()
    assert model.set_fast_path(False) is False
    (record,) = fast_path_log(caplog)
    assert record.getMessage() == "plain path (no oneDNN fast path): the fast path was switched off"
    caplog.clear()
    assert model.set_fast_path(True) is True
    assert len(fast_path_log(caplog)) == 1


def test_enable_disable_round_trips_keep_the_same_modules_classes_and_state(fused_calls):
    model = tiny()
    modules, params = list(model.modules()), list(model.parameters())
    classes = [type(module) for module in modules]
    state = {name: (t.data_ptr(), t.clone()) for name, t in model.state_dict().items()}
    seen: list[int] = []
    model.blocks[0].mlp.fc1.register_forward_hook(lambda module, args, out: seen.append(1))
    x = images()
    with torch.inference_mode():
        expected = model(x)
    for enable in (False, True, True, False, True):
        assert onednn.enable_fast_path(model, enable) is enable
        assert model.fast_path_in_use() is enable
        # Only flags change: the same objects of the same classes, parameters shared.
        assert all(a is b for a, b in zip(model.modules(), modules, strict=True))
        assert [type(module) for module in model.modules()] == classes
        assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
        after = model.state_dict()
        assert list(after) == list(state)
        for name, (pointer, value) in state.items():
            assert after[name].data_ptr() == pointer and torch.equal(after[name], value), name
        flags = [m.fast_path for m in model.modules() if isinstance(m, (OneDNNBlock, OneDNNLinear))]
        assert flags == [enable] * 10  # two blocks and their eight Linear layers
        with torch.inference_mode():
            torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)
    assert seen == [1] * 6  # the hook ran in every pass
    assert len(fused_calls) == 4  # block 0 has a hook; block 1 fused in the 4 fast runs


def test_a_fast_model_pickles_and_copies_with_its_fast_path(fused_calls):
    model, x = tiny(), images()
    expected = fused(model, x)  # packs weights first: the copies must not need them
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert [type(block) for block in twin.blocks] == [OneDNNBlock] * 2
        assert list(twin.state_dict()) == list(model.state_dict())
        torch.testing.assert_close(fused(twin, x), expected, atol=0, rtol=0)
    assert len(fused_calls) == 3 * 2


def force_plain(monkeypatch, how: str) -> str:
    """Make the capability check fail as a torch without one of the APIs would."""
    if how == "missing op":
        ops = onednn_support._REQUIRED_OPS + ("_no_such_op",)
        monkeypatch.setattr(onednn_support, "_REQUIRED_OPS", ops)
        return "torch.ops.mkldnn._no_such_op"
    if how == "missing internal":
        monkeypatch.setattr(onednn_support, "_get_current_dispatch_mode", None)
        return "torch.utils._python_dispatch._get_current_dispatch_mode"
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    return "no oneDNN"


@pytest.fixture
def fresh_support_check():
    """unsupported_reason() is cached: recompute it under the test's patches, and after them."""
    onednn.unsupported_reason.cache_clear()
    yield
    onednn.unsupported_reason.cache_clear()


def train_step(model: vitkit.VisionTransformer) -> dict[str, torch.Tensor]:
    """Logits and gradients of one training batch, then an SGD step on them."""
    x, y = images(4), torch.tensor([0, 1, 2, 3])
    model.train().zero_grad()
    torch.manual_seed(0)  # the same dropout and drop-path masks for every model
    logits = model(x)
    F.cross_entropy(logits, y).backward()
    results = {"logits": logits.detach()}
    results |= {name: p.grad.clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return results


def infer(model: vitkit.VisionTransformer) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(images(4))


@pytest.mark.parametrize("how", ["missing op", "missing internal", "no mkldnn"])
def test_without_the_private_apis_the_model_keeps_the_plain_path(
    monkeypatch, caplog, fresh_support_check, how
):
    supported = not onednn.unsupported_reason()
    if not supported and how != "no mkldnn":
        pytest.skip(f"{onednn.unsupported_reason()}: no other reason can be named")
    fused_runs: list[int] = []
    original = OneDNNBlock.forward_fused
    monkeypatch.setattr(
        OneDNNBlock, "forward_fused", lambda self, x: fused_runs.append(1) or original(self, x)
    )
    overrides = dict(drop_path_rate=0.2, drop_rate=0.1)
    fast = onednn_everywhere(tiny(**overrides))
    kernels: list[bool] = []
    handle = fast.blocks[1].mlp.fc2.register_forward_hook(
        lambda module, args, out: kernels.append(onednn_used(out))
    )
    fast_results = train_step(fast)
    handle.remove()
    fast_out = infer(fast)  # after the step: packed from the updated weights
    assert kernels == [supported] and len(fused_runs) == 2 * supported

    caplog.set_level(logging.DEBUG, logger=onednn_fused.__name__)
    missing = force_plain(monkeypatch, how)
    onednn.unsupported_reason.cache_clear()
    assert missing in onednn.unsupported_reason()
    plain = tiny(**overrides)  # the same seed: the same weights
    (record,) = fast_path_log(caplog)
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("plain path (no oneDNN fast path): ")
    assert missing in record.getMessage()
    assert onednn.enable_fast_path(plain, min_features=0) is False
    assert len(fast_path_log(caplog)) == 2
    assert not {type(m) for m in plain.modules()} & {OneDNNBlock, OneDNNLinear}
    plain_results = train_step(plain)
    plain_out = infer(plain)
    assert len(fused_runs) == 2 * supported  # the plain model never fused

    assert plain_results.keys() == fast_results.keys()
    for name in fast_results:
        torch.testing.assert_close(
            plain_results[name], fast_results[name], atol=1e-5, rtol=0, msg=name
        )
    torch.testing.assert_close(plain_out, fast_out, atol=1e-5, rtol=0)
    # A model built with the fast layers (e.g. unpickled from elsewhere) checks at run time
    # and runs plain; enable_fast_path switches its flags off and says why.
    torch.testing.assert_close(infer(fast), plain_out, atol=1e-5, rtol=0)
    assert len(fused_runs) == 2 * supported
    assert onednn.enable_fast_path(fast) is False
    assert not fast.fast_path_in_use() and not any(block.fast_path for block in fast.blocks)
    assert [type(block) for block in plain.blocks] == [Block] * 2


# -- chosen at build time: no class changes, TorchScript and torch.fx as built -----------------


def test_no_module_changes_class_after_construction():
    """The block a reader opens is the block that runs: no `__class__` assignment in src/."""
    import ast
    from pathlib import Path

    src = Path(vitkit.__file__).resolve().parent
    found = [
        f"{path.relative_to(src)}:{node.lineno}"
        for path in sorted(src.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr == "__class__"
    ]
    assert found == []
    assert not any("setattr" in path.read_text() and "__class__" in path.read_text()
                   for path in src.rglob("*.py"))  # fmt: skip


@requires_onednn
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_the_fast_blocks_plain_branch_is_block_forward():
    """OneDNNBlock restates Block.forward for TorchScript (no super() there): with LayerScale
    and drop path in training (same masks), and scripted, it computes Block's function bit for
    bit."""
    options = dict(num_heads=4, init_values=0.5, drop_path=0.5)
    torch.manual_seed(0)
    plain = Block(64, **options)
    torch.manual_seed(0)
    fast = OneDNNBlock(64, **options, linear_layer=OneDNNLinear)
    with torch.no_grad():
        for param in fast.parameters():  # non-trivial norms, biases and scales
            param.add_(torch.randn_like(param) * 0.1)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(4, 17, 64)
    for mode in (True, False):
        plain.train(mode), fast.train(mode)
        torch.manual_seed(1)
        want = plain(x)
        torch.manual_seed(1)
        assert torch.equal(fast(x), want)
    scripted = torch.jit.script(fast.eval())
    assert torch.equal(scripted(x), plain.eval()(x))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_summary_jit_and_fx_leave_the_model_as_built(fused_calls):
    """Nothing is switched off and back on: the classes, the flags and the fused path stay."""
    from vitkit.summary import flow

    model = tiny()
    classes = [type(m) for m in model.modules()]
    x = images()
    expected = fused(model, x)
    vitkit.summary(model, (1, 3, 32, 32))
    flow(model, (1, 3, 32, 32))
    scripted = torch.jit.script(model)
    traced = torch.fx.symbolic_trace(model)
    assert [type(m) for m in model.modules()] == classes and model.fast_path_in_use()
    calls = len(fused_calls)
    torch.testing.assert_close(fused(model, x), expected, atol=0, rtol=0)
    assert len(fused_calls) == calls + 2  # both blocks still fused
    with torch.inference_mode():
        torch.testing.assert_close(scripted(x), expected, atol=1e-5, rtol=0)  # the plain path
        assert len(fused_calls) == calls + 2
        assert torch.equal(traced(x), expected)  # fx calls the blocks: the fused path
    assert len(fused_calls) == calls + 4


# -- torch.fx and TorchScript: what timm's tests/test_models.py checks ------------------------


def small_vit() -> vitkit.VisionTransformer:
    """vit_small_patch16_224 with two blocks: wide enough (384) for every fast layer."""
    torch.manual_seed(0)
    return randomize(vitkit.create_model("vit_small_patch16_224", depth=2))


@requires_onednn
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "inference"])
def test_fx_traced_model_computes_the_eager_bits(fused_calls, grad):
    """timm's `test_model_forward_fx`: `torch.all(fx_outputs == outputs)`. With grad on (as
    timm runs it) the eager model takes oneDNN's products; under inference_mode the fused
    blocks. fx records each fast layer as one call, so the traced model takes the same."""
    model, x = small_vit().eval(), torch.randn(2, 3, 224, 224)
    with torch.inference_mode(not grad):
        outputs = model(x)
        fx_outputs = torch.fx.symbolic_trace(model)(x)
    assert len(fused_calls) == (0 if grad else 2 * 2)
    assert outputs.shape == (2, 1000) and not torch.isnan(outputs).any()
    assert torch.all(fx_outputs == outputs)


@requires_timm
@requires_torchvision
@requires_onednn
def test_timms_fx_feature_extractor_computes_the_eager_bits():
    model, x = small_vit().eval(), torch.randn(2, 3, 224, 224)
    outputs = model(x)
    fx_outputs = torch.cat(tuple(timm_fx_model(model)(x).values()))
    assert torch.all(fx_outputs == outputs)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_fx_then_torchscript_runs_the_plain_path():
    """timm's `test_model_forward_fx_torchscript`: the traced model scripts (its annotations
    are types, not strings) and computes what the scripted model computes, bit for bit."""
    model, x = small_vit().eval(), torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        scripted = torch.jit.script(torch.fx.symbolic_trace(model))(x)
        assert torch.equal(scripted, torch.jit.script(model)(x))
        # measured 1.3e-6 on logits up to 4: oneDNN's products against the plain path's
        torch.testing.assert_close(scripted, model(x), atol=1e-5, rtol=0)


@requires_onednn
def test_with_the_fast_path_off_fx_traces_through_the_blocks():
    """The escape hatch for graph passes that rewrite the layers inside a block."""
    model = tiny()
    graph = torch.fx.symbolic_trace(model).graph
    modules = {node.target for node in graph.nodes if node.op == "call_module"}
    assert {"blocks.0", "blocks.1"} <= modules
    model.set_fast_path(False)
    traced = torch.fx.symbolic_trace(model)
    modules = {node.target for node in traced.graph.nodes if node.op == "call_module"}
    assert "blocks.0" not in modules and "blocks.0.norm1" in modules
    x = images()
    with torch.inference_mode():
        assert torch.equal(traced(x), model(x))


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


def test_packed_weights_follow_a_fused_optimiser():
    """torch's fused AdamW updates weights without bumping their version counters, so the
    packed copies are dropped when the model enters training: after train / step / eval the
    fused path computes with the new weights (it served the first epoch's weights before)."""
    torch.manual_seed(0)
    model = vitkit.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=1, num_heads=3)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.inference_mode():
        model(x)  # packs the weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model.train()
    model(x).sum().backward()
    optimizer.step()
    model.eval()
    with torch.inference_mode():
        got = model(x)
        model.set_fast_path(False)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
