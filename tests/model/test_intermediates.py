"""forward_intermediates / get_intermediate_layers / ViTBackbone against block outputs."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from vitkit import VisionTransformer, ViTBackbone
from vitkit.model.features import default_out_indices

SIZES = [((32, 32), 8), ((60, 100), 20)]  # (img_size, patch): grids 4x4 and 3x5


def tiny(img_size=(32, 32), patch_size=8, **overrides) -> VisionTransformer:
    torch.manual_seed(0)
    options = dict(embed_dim=16, depth=3, num_heads=2, num_classes=4, in_chans=3)
    options.update(overrides)
    return VisionTransformer(img_size=img_size, patch_size=patch_size, **options).eval()


def block_outputs(model: VisionTransformer, x: Tensor) -> list[Tensor]:
    """Each block's output (B, P + N, D), captured by forward hooks on a plain encoder pass."""
    blocks = model.blocks.layers if model.config.encoder == "torch" else model.blocks
    captured: list[Tensor] = []
    handles = [b.register_forward_hook(lambda m, i, o: captured.append(o)) for b in blocks]
    try:
        with torch.no_grad():
            tokens = model.embed(x)
            for block in blocks:
                tokens = block(tokens)
    finally:
        for handle in handles:
            handle.remove()
    assert len(captured) == len(blocks)
    return captured


def to_map(tokens: Tensor, grid: tuple[int, int]) -> Tensor:
    """(B, N, D) patch tokens -> (B, D, h, w), written out position by position."""
    batch, _, dim = tokens.shape
    out = torch.empty(batch, dim, *grid)
    for row in range(grid[0]):
        for col in range(grid[1]):
            out[:, :, row, col] = tokens[:, row * grid[1] + col]
    return out


@pytest.mark.parametrize("img_size,patch", SIZES)
def test_shapes(img_size, patch):
    model = tiny(img_size, patch)
    x = torch.randn(2, 3, *img_size)
    grid = (img_size[0] // patch, img_size[1] // patch)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        tokens = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
    assert final.shape == (2, 1 + grid[0] * grid[1], 16)
    assert [m.shape for m in maps] == [(2, 16, *grid)] * 3
    assert [t.shape for t in tokens] == [(2, grid[0] * grid[1], 16)] * 3
    assert all(m.is_contiguous() for m in maps)


@pytest.mark.parametrize("img_size,patch", SIZES)
def test_values_equal_hooked_block_outputs(img_size, patch):
    model = tiny(img_size, patch)
    x = torch.randn(2, 3, *img_size)
    grid = (img_size[0] // patch, img_size[1] // patch)
    reference = block_outputs(model, x)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, [0, -1])
        tokens = model.forward_intermediates(x, [0, -1], output_fmt="NLC", intermediates_only=True)
        normed = model.forward_intermediates(x, [1], norm=True, intermediates_only=True)
        features = model.forward_features(x)
    for got_map, got_tokens, block in zip(maps, tokens, (0, 2)):
        torch.testing.assert_close(got_tokens, reference[block][:, 1:], rtol=0, atol=0)
        torch.testing.assert_close(got_map, to_map(reference[block][:, 1:], grid), rtol=0, atol=0)
    expected = to_map(model.norm(reference[1])[:, 1:], grid)
    torch.testing.assert_close(normed[0], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(final, features, rtol=0, atol=1e-5)


def test_indices_int_list_order_and_negative():
    model = tiny()
    x = torch.randn(1, 3, 32, 32)
    ref = [out[:, 1:] for out in block_outputs(model, x)]
    with torch.no_grad():
        last_two = model.forward_intermediates(x, 2, output_fmt="NLC", intermediates_only=True)
        asked = model.forward_intermediates(x, [2, -3], output_fmt="NLC", intermediates_only=True)
    assert torch.equal(last_two[0], ref[1]) and torch.equal(last_two[1], ref[2])
    assert torch.equal(asked[0], ref[2]) and torch.equal(asked[1], ref[0])


@pytest.mark.parametrize(
    "kwargs,count", [(dict(distilled=True), 2), (dict(class_token=False, global_pool="avg"), 0)]
)
def test_prefix_tokens_split_off(kwargs, count):
    model = tiny(**kwargs)
    x = torch.randn(2, 3, 32, 32)
    ref = block_outputs(model, x)[-1]
    with torch.no_grad():
        ((feats, prefix),) = model.forward_intermediates(
            x, 1, return_prefix_tokens=True, intermediates_only=True
        )
    assert prefix.shape == (2, count, 16)
    assert torch.equal(prefix, ref[:, :count])
    assert torch.equal(feats, to_map(ref[:, count:], (4, 4)))


def test_stop_early_skips_later_blocks():
    model = tiny()
    calls = []
    model.blocks[2].register_forward_hook(lambda *_: calls.append(2))
    with torch.no_grad():
        out = model.forward_intermediates(
            torch.randn(1, 3, 32, 32), [0, 1], stop_early=True, intermediates_only=True
        )
    assert len(out) == 2 and calls == []


def test_get_intermediate_layers_matches():
    model = tiny(img_size=(60, 100), patch_size=20)
    x = torch.randn(2, 3, 60, 100)
    ref = block_outputs(model, x)
    with torch.no_grad():
        tokens = model.get_intermediate_layers(x)
        maps = model.get_intermediate_layers(x, 2, reshape=True, norm=True)
    assert len(tokens) == 1 and torch.equal(tokens[0], ref[2][:, 1:])
    assert [m.shape for m in maps] == [(2, 16, 3, 5)] * 2
    torch.testing.assert_close(maps[1], to_map(model.norm(ref[2])[:, 1:], (3, 5)))


def test_torch_encoder_backend():
    model = tiny(encoder="torch")
    x = torch.randn(2, 3, 32, 32)
    ref = block_outputs(model, x)
    with torch.no_grad():
        (got,) = model.forward_intermediates(x, [1], output_fmt="NLC", intermediates_only=True)
    torch.testing.assert_close(got, ref[1][:, 1:], rtol=0, atol=1e-6)


def test_grad_checkpointing_same_values_and_gradients():
    model = tiny().train()
    x = torch.randn(2, 3, 32, 32)
    _, plain = model.forward_intermediates(x, [1])
    plain[0].sum().backward()
    grad = model.blocks[0].mlp.fc1.weight.grad.clone()
    model.zero_grad()
    model.set_grad_checkpointing()
    _, ckpt = model.forward_intermediates(x, [1])
    ckpt[0].sum().backward()
    torch.testing.assert_close(ckpt[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(model.blocks[0].mlp.fc1.weight.grad, grad)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(indices=4), r"indices=4 asks for the last 4 blocks of a model with 3; pass an int"),
        (dict(indices=0), r"indices=0 asks for the last 0 blocks"),
        (dict(indices=[3]), r"block index 3 is out of range for a model with 3 blocks; use 0 to 2"),
        (dict(indices=[-4]), r"block index -4 is out of range .* or -3 to -1 from the end"),
        (dict(indices=[]), r"indices is empty"),
        (dict(output_fmt="NHWC"), r"output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"),
        (dict(stop_early=True), r"stop_early=True skips the last blocks.*intermediates_only=True"),
    ],
)
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny().forward_intermediates(torch.randn(1, 3, 32, 32), **kwargs)


def test_default_out_indices():
    assert default_out_indices(12) == [2, 5, 8, 11]
    assert default_out_indices(24) == [5, 11, 17, 23]
    assert default_out_indices(3) == [0, 1, 2]
    assert default_out_indices(1) == [0]


@pytest.mark.parametrize("img_size,patch", SIZES)
def test_backbone_maps_and_info(img_size, patch):
    model = tiny(img_size, patch)
    backbone = ViTBackbone(model, out_indices=(0, -1))
    x = torch.randn(2, 3, *img_size)
    grid = (img_size[0] // patch, img_size[1] // patch)
    ref = block_outputs(model, x)
    with torch.no_grad():
        maps = backbone(x)
    assert backbone.out_indices == [0, 2]
    assert backbone.channels == [16, 16]
    assert backbone.reductions == [patch, patch]
    assert backbone.feature_info.get_dicts() == [
        {"num_chs": 16, "reduction": patch, "module": "blocks.0", "index": 0},
        {"num_chs": 16, "reduction": patch, "module": "blocks.2", "index": 2},
    ]
    assert torch.equal(maps[0], to_map(ref[0][:, 1:], grid))
    assert torch.equal(maps[1], to_map(ref[2][:, 1:], grid))


def test_backbone_dynamic_size_non_square_patch_and_training():
    model = tiny((32, 48), (8, 16), num_classes=0, dynamic_img_size=True).train()
    backbone = ViTBackbone(model, norm=True)  # depth 3 -> every block
    assert backbone.out_indices == [0, 1, 2]
    assert backbone.reductions == [(8, 16)] * 3
    maps = backbone(torch.randn(2, 3, 40, 80))  # another size: grid 5x5
    assert [m.shape for m in maps] == [(2, 16, 5, 5)] * 3
    sum(m.square().mean() for m in maps).backward()
    assert model.patch_embed.proj.weight.grad is not None
    assert model.blocks[2].mlp.fc2.weight.grad is not None
    assert "out_indices=[0, 1, 2], norm=True" in repr(backbone)
