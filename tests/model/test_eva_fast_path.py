"""EVA's fused CPU path (`eva/onednn.py`) computes what the plain EVA blocks compute, on random
weights (`randomize`: biases, norms and LayerScale far from their initial values), for each
kind of block timm's `eva.py` builds: EVA-02 (packed SwiGLU, EVA's q / v biases, interleaved
RoPE; separate q / k / v with a hidden-norm SwiGLU; the CLIP's inner attention norm; post-norm),
DINOv3 (class and register tokens, LayerScale, half-layout RoPE; GELU or aligned SwiGLU),
Perception Encoder (plain qkv biases, pre-transformer norm, attention pooling), RoPE-Mixed.
The plain path equals timm's already (test_eva.py).

Tolerances, from measurement (2-core AVX-512 CPU): float32, at most 3.4e-6 between the fused
and the plain path on outputs up to 5 (oneDNN's products sum in another order); tolerance
1e-5 + 1e-5 |x|. bf16 autocast: the fused path's distance to the float32 output was at most
1.6x the plain bf16 path's (2.2e-3 against 1.5e-3; most cases ~1x); tolerance 2.5x.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _helpers import randomize, requires_onednn
from vitkit import create_model
from vitkit.model import onednn_support, registry
from vitkit.model.eva.block import EvaBlock
from vitkit.model.eva.onednn import OneDNNEvaBlock, eva_block_class
from vitkit.model.onednn_fused import _PACKED
from vitkit.model.onednn_support import native_bf16, unsupported_reason

# name, overrides (two blocks; the wide ones narrowed)
NARROW = dict(img_size=112, embed_dim=256, num_heads=4)
CASES = {
    "eva02_small": ("eva02_small_patch14_224", dict(img_size=112)),
    "dinov3_small": ("vit_small_patch16_dinov3_qkvb", {}),
    "pe_core_small": ("vit_pe_core_small_patch16_384", dict(img_size=128)),
    "eva02_base": ("eva02_base_patch14_224", NARROW),
    "eva02_clip": ("eva02_base_patch16_clip_224", NARROW),
    "post_norm": ("eva02_enormous_patch14_clip_224", NARROW),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", dict(img_size=112)),
    "dinov3_swiglu": ("vit_small_plus_patch16_dinov3", {}),
}
FP32 = dict(atol=1e-5, rtol=1e-5)


def build(case: str, **extra) -> nn.Module:
    name, overrides = CASES[case]
    torch.manual_seed(0)
    return randomize(create_model(name, depth=2, **overrides, **extra))


def images(model: nn.Module, batch: int = 3) -> torch.Tensor:
    """A batch at the model's size; a DINOv3 (dynamic size) gets an oblong 8 x 6 patch one."""
    config = model.config
    if config.dynamic_img_size:
        size = (8 * config.patch_size, 6 * config.patch_size)
    else:
        size = (config.img_size,) * 2 if isinstance(config.img_size, int) else config.img_size
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(1))


def plain_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.set_fast_path(False)
    with torch.inference_mode():
        out = model(x)
    model.set_fast_path(True)
    return out


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """Counts calls of OneDNNEvaBlock.forward_fused, the fused inference path."""
    if unsupported_reason():
        pytest.skip(unsupported_reason())
    calls: list[int] = []
    original = OneDNNEvaBlock.forward_fused

    def spy(self, x, rope):
        calls.append(1)
        return original(self, x, rope)

    monkeypatch.setattr(OneDNNEvaBlock, "forward_fused", spy)
    return calls


# -- the fused path computes the plain path's function -----------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_fused_blocks_match_the_plain_path(fused_calls, case):
    model = build(case)
    x = images(model)
    assert [block.unfused_layer() for block in model.blocks] == ["", ""]
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2  # both blocks took it
    torch.testing.assert_close(fast, plain_output(model, x), **FP32)
    assert len(fused_calls) == 2  # and set_fast_path(False) kept it off


@pytest.mark.parametrize("case", ["eva02_small", "dinov3_small", "pe_core_small"])
def test_batches_in_slices_match_the_plain_path(fused_calls, case):
    model = build(case)
    x = images(model, batch=5)
    tokens = model.embed(x).shape[1]
    budget = 2 * tokens * model.blocks[0].fused_hidden() * 4  # two images a slice
    assert model.set_fast_path(True)
    for block in model.blocks:
        block.slice_bytes = budget
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    torch.testing.assert_close(fast, plain_output(model, x), **FP32)


def bf16_errors(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """How far the fused and the plain path under bf16 autocast land from float32's output."""
    reference = plain_output(model, x)
    errors = []
    for fast in (True, False):
        model.set_fast_path(fast)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        errors.append((out.float() - reference).abs().max().item())
    model.set_fast_path(True)
    return errors[0], errors[1]


@pytest.mark.skipif(
    bool(unsupported_reason()) or not native_bf16(), reason="no bf16 oneDNN kernels on this CPU"
)
@pytest.mark.parametrize("case", CASES)
def test_bf16_autocast_is_within_bf16_rounding(fused_calls, case):
    model = build(case)
    fused_error, plain_error = bf16_errors(model, images(model))
    assert len(fused_calls) == 2  # the fused run only
    assert 0 < fused_error <= 2.5 * plain_error  # measured at most 1.6x


@pytest.mark.skipif(
    bool(unsupported_reason()) or not native_bf16(), reason="no bf16 oneDNN kernels on this CPU"
)
def test_bf16_weights_take_the_fused_path(fused_calls):
    model = build("dinov3_small").to(torch.bfloat16)
    x = images(model).to(torch.bfloat16)
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 2
    plain = plain_output(model, x).float()
    # measured 3.9e-3 on outputs up to 0.6 (bf16 keeps 8 bits)
    torch.testing.assert_close(fast.float(), plain, atol=1.5e-2, rtol=0)


def test_the_packed_halves_of_a_swiglu_follow_changes_of_its_weights(fused_calls):
    """EVA-02's packed SwiGLU runs gate and value as two products on packed halves of fc1,
    packed once and again after an in-place update."""
    model = build("eva02_small")
    x = images(model)
    fc1 = model.blocks[0].mlp.fc1
    with torch.inference_mode():
        model(x)
    assert set(_PACKED[fc1]) == {(torch.float32, (0, 1024)), (torch.float32, (1024, 2048))}
    with torch.no_grad():
        fc1.weight[1500:].mul_(1.5)  # the value half only
        fc1.weight[:10].add_(0.1)  # and a few gate rows
    with torch.inference_mode():
        fast = model(x)
    assert len(fused_calls) == 4
    torch.testing.assert_close(fast, plain_output(model, x), **FP32)


# -- what is not fused, and why ----------------------------------------------------------------


class ScaledMlp(nn.Module):
    """An MLP the fused kernels do not know."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 0.5 * self.inner(x)


def tanh_gelu(block: EvaBlock) -> str:
    block.mlp.act = nn.GELU(approximate="tanh")
    return "mlp.act is GELU(approximate='tanh'); the fused one is exact"


def explicit_attention(block: EvaBlock) -> str:
    block.attn.fused_attn = False
    return "attn.fused_attn is False (explicit attention requested)"


def wrap_mlp(block: EvaBlock) -> str:
    block.mlp = ScaledMlp(block.mlp)
    return "mlp is a ScaledMlp, not one the fused kernels implement (Mlp, SwiGLU, SwiGLUPacked)"


def add_module(block: EvaBlock) -> str:
    block.attn.bias_table = nn.Identity()
    return "attn.bias_table (Identity) is not a layer the fused kernels implement"


def drop_slot(block: EvaBlock) -> str:
    del block.mlp.drop2
    return "mlp.drop2 is missing"


def hook_fc2(block: EvaBlock) -> str:
    block.mlp.fc2.register_forward_hook(lambda module, args, out: None)
    return "mlp.fc2 has forward hooks (they must see it run)"


def attention_dropout(block: EvaBlock) -> str:
    block.attn.train()
    return "attn is in training mode"


@pytest.mark.parametrize(
    "change", [tanh_gelu, explicit_attention, wrap_mlp, add_module, hook_fc2, attention_dropout]
)
def test_a_block_the_fused_kernels_do_not_compute_runs_plain_and_says_why(fused_calls, change):
    model = build("dinov3_small")
    x = images(model)
    with torch.inference_mode():
        reason = change(model.blocks[1])
        tokens = model.embed(x)
        assert model.blocks[1].fast_path_blocker(tokens) == reason
        assert model.blocks[0].fast_path_blocker(tokens) == ""
        out = model(x)
    assert len(fused_calls) == 1  # block 0 only
    if change is not attention_dropout:  # (dropout 0 computes the same; training differs)
        torch.testing.assert_close(out, plain_output(model, x), **FP32)


@requires_onednn
def test_a_missing_slot_is_named():
    block = build("eva02_small").blocks[0]
    assert block.unfused_layer() == ""
    assert drop_slot(block) == block.unfused_layer()


@requires_onednn
def test_rmsnorm_on_queries_and_keys_is_not_fused():
    """Sapiens2's RMSNorm q / k norms would meet bf16 queries on float32 weights unconverted."""
    torch.manual_seed(0)
    model = randomize(create_model("vit_base_patch16_sapiens2", depth=2, num_kv_heads=(12, 6)))
    reason = "attn.q_norm is a RMSNorm, not one the fused kernels implement (Identity, LayerNorm)"
    assert [block.unfused_layer() for block in model.blocks] == [reason] * 2


@requires_onednn
def test_the_shared_blockers_read_the_eva_blocks_weights():
    """The checks are the ViT's (`FusedBlock.fast_path_blocker`, tested in test_fast_paths.py);
    the dtype they check against is the attention projection's."""
    model = build("eva02_small")
    block, x = model.blocks[0], torch.randn(2, 65, 384)
    with torch.inference_mode():
        assert block.fast_path_blocker(x) == ""
        assert block.fast_path_blocker(x.double()) == (
            "input torch.float64 3-D does not match 3-D torch.float32 weights"
        )
        block.attn.proj.to(torch.float64)
        assert "does not match 3-D torch.float64 weights" in block.fast_path_blocker(x)


# -- training, autograd and attention maps take the plain path ---------------------------------


def test_training_and_grad_take_the_plain_path(fused_calls):
    model = build("dinov3_small", drop_path_rate=0.2)
    x = images(model)
    logits = model(x)  # eval mode, grad on: plain
    logits.sum().backward()
    assert fused_calls == []
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.set_fast_path(False)
    model(x).sum().backward()
    for name, grad in grads.items():  # the same function: the plain blocks ran both times
        assert torch.equal(model.get_parameter(name).grad, grad), name
    model.set_fast_path(True)
    model.train()
    torch.manual_seed(0)
    model(x).sum().backward()
    assert fused_calls == []
    with torch.no_grad():
        model(x)
    assert fused_calls == []  # training mode, grad off: still plain (drop-path is random)


def test_attention_maps_use_the_plain_path(fused_calls):
    model = build("eva02_small")
    x = images(model)
    with torch.inference_mode():
        logits, maps = model(x, return_attention=True)
    assert len(maps) == 2 and fused_calls == []
    torch.testing.assert_close(logits, plain_output(model, x), **FP32)  # softmax, not SDPA


# -- the record, the switch, the build ----------------------------------------------------------


def test_the_record_declares_the_fused_path_and_the_model_switches_it(fused_calls):
    assert registry.get_architecture("eva").fused_cpu
    model = build("pe_core_small")
    assert [type(block) for block in model.blocks] == [OneDNNEvaBlock] * 2
    assert model.fast_path_in_use()
    assert model.set_fast_path(False) is False
    assert not model.fast_path_in_use() and not any(b.fast_path for b in model.blocks)
    assert model.set_fast_path(True) is True
    assert all(b.fast_path for b in model.blocks)


class Blocks(nn.Module):
    """The encoder of an `Eva` with its rotary embedding as an input, as a caller tracing its
    own module around the blocks holds them (the whole `Eva` computes its grid from the input
    size, which torch.fx does not trace)."""

    def __init__(self, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.blocks = blocks

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, rope)
        return x


def test_fx_records_each_fused_block_as_one_call_with_its_rope(fused_calls):
    model = build("dinov3_small")
    batch = images(model)
    encoder = Blocks(model.blocks)
    with torch.inference_mode():
        x = model.embed(batch)
        rope = model.rope_embed(model.patch_embed.grid_for(*batch.shape[-2:]), x.device)
        eager = encoder(x, rope)
        traced = torch.fx.symbolic_trace(encoder)
        calls = [node.target for node in traced.graph.nodes if node.op == "call_module"]
        assert calls == ["blocks.0", "blocks.1"]
        assert torch.equal(traced(x, rope), eager)  # the graph calls the fused blocks
    assert len(fused_calls) == 4


@pytest.fixture
def fresh_support_check():
    """unsupported_reason() is cached: recompute it under the test's patches, and after them."""
    onednn_support.unsupported_reason.cache_clear()
    yield
    onednn_support.unsupported_reason.cache_clear()


def test_without_the_private_apis_the_model_is_built_plain(monkeypatch, fresh_support_check):
    fast = build("eva02_small")
    x = images(fast)
    expected = plain_output(fast, x)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    onednn_support.unsupported_reason.cache_clear()
    assert eva_block_class() is EvaBlock
    plain = build("eva02_small")  # the same seed: the same weights
    assert [type(block) for block in plain.blocks] == [EvaBlock] * 2
    assert plain.set_fast_path(True) is False
    with torch.inference_mode():
        torch.testing.assert_close(plain(x), expected, atol=0, rtol=0)
        # a model built with the fused blocks checks at run time and runs plain
        torch.testing.assert_close(fast(x), expected, atol=0, rtol=0)


def test_gelu_mlp_matches_for_either_epilogue(fused_calls):
    model = build("dinov3_small")
    x = images(model)
    expected = plain_output(model, x)
    for in_epilogue in (True, False, None):  # None: the CPU's default
        for block in model.blocks:
            block.gelu_in_epilogue = in_epilogue
        with torch.inference_mode():
            torch.testing.assert_close(model(x), expected, **FP32)
    assert len(fused_calls) == 6
