"""Patch embedding, attention, MLP and block: each against its definition."""

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from vitkit.model import layers
from vitkit.model.layers import (
    Attention,
    Block,
    DropPath,
    PatchEmbed,
    conv_to_unfold_weight,
    unfold_to_conv_weight,
)


def paired_embeddings(**kwargs):
    """A conv and an unfold PatchEmbed holding the same weights."""
    torch.manual_seed(0)
    conv = PatchEmbed(kind="conv", **kwargs)
    unfold = PatchEmbed(kind="unfold", **kwargs)
    with torch.no_grad():
        unfold.proj.weight.copy_(conv_to_unfold_weight(conv.proj.weight))
        unfold.proj.bias.copy_(conv.proj.bias)
    return conv, unfold


@pytest.mark.parametrize(
    "img_size, patch_size, tokens",
    [(224, 16, 196), ((60, 100), 20, 15), ((32, 48), (8, 4), 48), (8, 2, 16)],
)
def test_conv_and_unfold_embeddings_are_equal(img_size, patch_size, tokens):
    conv, unfold = paired_embeddings(
        img_size=img_size, patch_size=patch_size, in_chans=3, embed_dim=32
    )
    size = (img_size, img_size) if isinstance(img_size, int) else img_size
    x = torch.randn(2, 3, *size)
    out_conv, grid = conv(x)
    out_unfold, grid_unfold = unfold(x)
    assert out_conv.shape == (2, tokens, 32)
    assert grid == grid_unfold == conv.grid_size
    torch.testing.assert_close(out_unfold, out_conv, atol=1e-5, rtol=1e-5)


def test_weight_helpers_round_trip():
    weight = torch.randn(16, 3, 4, 8)
    linear = conv_to_unfold_weight(weight)
    assert linear.shape == (16, 3 * 4 * 8)
    assert torch.equal(unfold_to_conv_weight(linear, 3, (4, 8)), weight)


def test_patch_embedding_matches_manual_patch_flattening():
    """Token n is the projection of patch (row, col) = divmod(n, grid_w), flattened C, ph, pw."""
    conv, _ = paired_embeddings(img_size=(6, 9), patch_size=3, in_chans=2, embed_dim=5)
    x = torch.randn(1, 2, 6, 9)
    out, (grid_h, grid_w) = conv(x)
    weight = conv.proj.weight.reshape(5, -1)
    for n in range(grid_h * grid_w):
        row, col = divmod(n, grid_w)
        patch = x[0, :, row * 3 : row * 3 + 3, col * 3 : col * 3 + 3].reshape(-1)
        torch.testing.assert_close(out[0, n], weight @ patch + conv.proj.bias, atol=1e-5, rtol=0)


def test_patch_embedding_optional_norm():
    embed = PatchEmbed(img_size=8, patch_size=4, in_chans=1, embed_dim=6, norm=True)
    out, _ = embed(torch.randn(3, 1, 8, 8))
    assert isinstance(embed.norm, nn.LayerNorm)
    torch.testing.assert_close(out.mean(-1), torch.zeros(3, 4), atol=1e-5, rtol=0)


def explicit_attention(module: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale) v written out from the module's weights."""
    batch, tokens, dim = x.shape
    heads, head_dim = module.num_heads, dim // module.num_heads
    q, k, v = (x @ module.qkv.weight.T + module.qkv.bias).split(dim, dim=-1)

    def split(t):
        return t.reshape(batch, tokens, heads, head_dim).transpose(1, 2)  # (B, heads, N, hd)

    q, k, v = split(q), split(k), split(v)
    weights = torch.softmax(q @ k.transpose(-2, -1) * module.scale, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, tokens, dim)
    return out @ module.proj.weight.T + module.proj.bias, weights


@pytest.mark.parametrize("qk_scale", [None, 0.3])
def test_sdpa_and_explicit_attention_equal_the_formula(qk_scale):
    torch.manual_seed(0)
    attn = Attention(48, num_heads=6, qk_scale=qk_scale).eval()
    assert attn.scale == (qk_scale if qk_scale else 8**-0.5)
    x = torch.randn(2, 11, 48)
    reference, reference_weights = explicit_attention(attn, x)
    fused = attn(x)
    attn.fused_attn = False
    explicit = attn(x)
    out, weights = attn.forward_with_weights(x)
    for result in (fused, explicit, out):
        torch.testing.assert_close(result, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, reference_weights, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6, 11), atol=1e-6, rtol=0)


def test_attention_weights_stay_fp32_under_autocast():
    attn = Attention(32, num_heads=4)
    q = torch.randn(1, 4, 5, 8, dtype=torch.bfloat16)
    k = torch.randn(1, 4, 5, 8, dtype=torch.bfloat16)
    seen = {}
    original = torch.Tensor.softmax

    def spy(self, *args, **kwargs):
        seen["dtype"] = self.dtype
        return original(self, *args, **kwargs)

    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "softmax", spy)
        weights = attn.attention_weights(q, k)
    assert seen["dtype"] == torch.float32
    assert weights.dtype == torch.bfloat16


def test_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="embed_dim 100 is not divisible by num_heads 3"):
        Attention(100, num_heads=3)


def test_qkv_is_one_fused_linear():
    attn = Attention(64, num_heads=4, qkv_bias=False)
    assert attn.qkv.weight.shape == (192, 64)
    assert attn.qkv.bias is None


def test_drop_path_scales_kept_samples_and_is_identity_in_eval():
    torch.manual_seed(0)
    drop = DropPath(0.5)
    x = torch.ones(1000, 4)
    out = drop(x)
    kept = out[:, 0] != 0
    assert torch.all(out[kept] == 2.0)  # survivors are scaled by 1 / keep
    assert 400 < int(kept.sum()) < 600
    assert torch.all(out == out[:, :1])  # a whole sample is dropped, not single entries
    assert torch.equal(drop.eval()(x), x)


def test_block_is_pre_norm_residual():
    torch.manual_seed(0)
    block = Block(32, num_heads=4, mlp_ratio=2.0).eval()
    x = torch.randn(2, 7, 32)
    hidden = x + block.attn(block.norm1(x))
    expected = hidden + block.mlp.fc2(torch.nn.functional.gelu(block.mlp.fc1(block.norm2(hidden))))
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    assert block.mlp.fc1.out_features == 64
    assert block.norm1.eps == 1e-6
    assert isinstance(block.mlp.act, nn.GELU) and block.mlp.act.approximate == "none"
    out, weights = block.forward_with_weights(x)
    torch.testing.assert_close(out, block(x), atol=1e-6, rtol=0)
    assert weights.shape == (2, 4, 7, 7)


def test_layer_scale_multiplies_branches():
    block = Block(16, num_heads=2, init_values=0.1)
    assert torch.all(block.ls1.gamma == 0.1) and block.ls1.gamma.shape == (16,)
    x = torch.randn(1, 3, 16)
    expected = x + 0.1 * block.attn(block.norm1(x))
    expected = expected + 0.1 * block.mlp(block.norm2(expected))
    torch.testing.assert_close(block.eval()(x), expected, atol=1e-6, rtol=0)


def test_gelu_is_the_exact_erf_form():
    x = torch.linspace(-3, 3, 13)
    expected = torch.tensor([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    torch.testing.assert_close(Block(8, num_heads=2).mlp.act(x), expected, atol=1e-6, rtol=0)


def test_layers_are_plain_pytorch():
    """The CPU fast path and its private torch APIs live in onednn.py, never in the paper's
    layers: a torch upgrade cannot break these."""
    files = sorted(Path(layers.__file__).parent.glob("*.py"))
    assert {path.name for path in files} >= {"attention.py", "block.py", "mlp.py", "norm.py"}
    for path in files:
        source = path.read_text().lower()
        for name in ("mkldnn", "onednn", "torch.ops", "_c.", "torch._", "_python_dispatch"):
            assert name not in source, (path.name, name)
    block = Block(16, num_heads=2)
    projections = [block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2]
    assert [type(layer) for layer in projections] == [nn.Linear] * 4
