"""The nn.TransformerEncoderLayer backend computes the same function as the native blocks."""

import pytest
import torch
from torch import nn

from _helpers import randomize
from vitkit import VisionTransformer
from vitkit.model.vit.torch_encoder import (
    native_to_torch_state_dict,
    torch_to_native_state_dict,
)

SMALL = dict(img_size=16, patch_size=4, num_classes=6, embed_dim=48, depth=3, num_heads=4)


def pair(**overrides):
    """A native model with random biases and norms, and the torch encoder holding its weights."""
    torch.manual_seed(0)
    native = randomize(VisionTransformer(**{**SMALL, **overrides}))
    backend = VisionTransformer(**{**SMALL, **overrides}, encoder="torch")
    backend.load_state_dict(native_to_torch_state_dict(native.state_dict()), strict=True)
    return native, backend


def layer_kinds(module: nn.Module) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.LayerNorm)):
            name = "Linear" if isinstance(m, nn.Linear) else "LayerNorm"
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize(
    "options", [dict(), dict(class_token=False, global_pool="avg", pos_embed="sincos2d")]
)
def test_same_output_in_fp32(options):
    native, backend = pair(**options)
    x = torch.randn(3, 3, 16, 16)
    # measured at most 2.5e-7 on logits up to 0.87 (random biases and norms); tolerance 1e-5
    for mode in ("eval", "train"):  # train mode with zero dropout takes the non-fused path
        getattr(native, mode)(), getattr(backend, mode)()
        torch.testing.assert_close(backend(x), native(x), atol=1e-5, rtol=0)
    with torch.no_grad():  # eval + no_grad may take PyTorch's fused encoder kernel
        torch.testing.assert_close(backend.eval()(x), native.eval()(x), atol=1e-5, rtol=0)


def test_same_parameter_count_and_layer_composition():
    native, backend = pair()
    assert sum(p.numel() for p in native.parameters()) == sum(
        p.numel() for p in backend.parameters()
    )
    # MultiheadAttention packs q, k, v into one in-projection: the qkv Linear has no module there.
    native_kinds = layer_kinds(native)
    backend_kinds = layer_kinds(backend)
    assert native_kinds["LayerNorm"] == backend_kinds["LayerNorm"] == 2 * 3 + 1
    assert native_kinds["Linear"] == backend_kinds["Linear"] + 3 == 4 * 3 + 1
    layer = backend.blocks.layers[0]
    assert layer.norm_first and layer.self_attn.batch_first
    assert layer.norm1.eps == 1e-6 and layer.linear1.out_features == 4 * 48


def test_state_dict_renames_round_trip():
    native, backend = pair()
    assert "blocks.layers.0.self_attn.in_proj_weight" in backend.state_dict()
    back = torch_to_native_state_dict(backend.state_dict())
    assert sorted(back) == sorted(native.state_dict())
    assert all(torch.equal(back[k], v) for k, v in native.state_dict().items())


def test_same_gradients():
    native, backend = pair()
    x = torch.randn(2, 3, 16, 16)
    native.train()(x).square().sum().backward()
    backend.train()(x).square().sum().backward()
    grads = native_to_torch_state_dict({n: p.grad for n, p in native.named_parameters()})
    for name, param in backend.named_parameters():  # measured 7.2e-7 on gradients up to 3.7
        torch.testing.assert_close(param.grad, grads[name], atol=1e-5, rtol=0, msg=name)


def test_dropout_rate_reaches_every_place_but_qkv():
    _, backend = pair(drop_rate=0.1, attn_drop_rate=0.1)
    layer = backend.blocks.layers[0]
    assert layer.self_attn.dropout == 0.1  # on the attention weights, not on the qkv projection
    assert layer.dropout.p == layer.dropout1.p == layer.dropout2.p == 0.1


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(drop_path_rate=0.1), "drop_path_rate must be 0"),
        (dict(init_values=1e-5), "init_values must be None"),
        (dict(attn_drop_rate=0.1), "attn_drop_rate must equal drop_rate"),
        (dict(qk_scale=0.5), "qk_scale must be None"),
        (dict(qkv_bias=False), "qkv_bias must be True"),
    ],
)
def test_options_the_torch_layer_cannot_express_are_refused(options, message):
    with pytest.raises(
        ValueError, match=f"encoder='torch' cannot express these options: .*{message}"
    ):
        VisionTransformer(**SMALL, **options, encoder="torch")


def test_attention_maps_need_the_native_encoder():
    _, backend = pair()
    with pytest.raises(ValueError, match="return_attention=True needs encoder='native'"):
        backend(torch.randn(1, 3, 16, 16), return_attention=True)
