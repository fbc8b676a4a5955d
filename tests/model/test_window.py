"""ViTDet's block options: window attention, global blocks, decomposed relative positions."""

import pytest
import torch
import torch.nn.functional as F

from vitkit.model import VisionTransformer, ViTConfig
from vitkit.model.layers import Block, WindowBlock, window_partition, window_unpartition
from vitkit.model.layers.window import decomposed_rel_pos_bias, relative_table
from vitkit.model.vit import onednn

TINY = dict(patch_size=8, embed_dim=32, depth=4, num_heads=2, num_classes=0)
VITDET = dict(TINY, class_token=False, global_pool="avg", dynamic_img_size=True)


def reference_attention(attn, x, rel_pos=None):
    """softmax(q k^T * scale [+ q . R_h[i - k] + q . R_w[j - l]]) v, written out, on maps
    (B, h, w, D), the relative term one (query, key) pair at a time."""
    batch, height, width, dim = x.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    qkv = attn.qkv(x.reshape(batch, height * width, dim)).reshape(batch, -1, 3, heads, head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, heads, N, head_dim)
    scores = (q * attn.scale) @ k.transpose(-2, -1)
    if rel_pos is not None:
        table_h, table_w = rel_pos
        for query in range(height * width):
            i, j = divmod(query, width)
            for key in range(height * width):
                ki, kj = divmod(key, width)
                r_h = table_h[i - ki + height - 1]
                r_w = table_w[j - kj + width - 1]
                scores[:, :, query, key] += q[:, :, query] @ r_h + q[:, :, query] @ r_w
    out = scores.softmax(-1) @ v  # (B, heads, N, head_dim)
    out = out.transpose(1, 2).reshape(batch, height, width, dim)
    return attn.proj(out)


def reference_window_block(block, x, window):
    """The block with its attention run window by window over the zero-padded normalised map."""
    batch, height, width, dim = x.shape
    normed = block.norm1(x)
    pad_h, pad_w = -height % window, -width % window
    padded = F.pad(normed, (0, 0, 0, pad_w, 0, pad_h))
    out = torch.zeros_like(padded)
    rel_pos = None
    if block.attn.rel_pos_h is not None:
        rel_pos = (block.attn.rel_pos_h, block.attn.rel_pos_w)
    for top in range(0, height + pad_h, window):
        for left in range(0, width + pad_w, window):
            patch = padded[:, top : top + window, left : left + window]
            out[:, top : top + window, left : left + window] = reference_attention(
                block.attn, patch, rel_pos
            )
    x = x + out[:, :height, :width]
    return x + block.mlp(block.norm2(x))


def random_(module):
    torch.manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.normal_(0, 0.2)
    return module.eval()


@pytest.mark.parametrize("use_rel_pos", [False, True])
@pytest.mark.parametrize("size", [(6, 6), (5, 7)])
def test_window_block_equals_attention_window_by_window(use_rel_pos, size):
    block = random_(WindowBlock(16, num_heads=2, window_size=3, rel_pos=(4, 4) if use_rel_pos
                                else None))  # fmt: skip
    if use_rel_pos:  # a window block's tables are the window's: 2 * 3 - 1 rows
        assert block.attn.rel_pos_h.shape == block.attn.rel_pos_w.shape == (5, 8)
    x = torch.randn(2, *size, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x), reference_window_block(block, x, 3))
        block.attn.fused_attn = False  # the explicit path computes the same
        torch.testing.assert_close(block(x), reference_window_block(block, x, 3))


def test_global_block_with_rel_pos_equals_the_written_out_bias():
    block = random_(WindowBlock(16, num_heads=2, window_size=0, rel_pos=(3, 4)))
    assert block.attn.rel_pos_h.shape == (5, 8) and block.attn.rel_pos_w.shape == (7, 8)
    x = torch.randn(2, 3, 4, 16)
    rel_pos = (block.attn.rel_pos_h, block.attn.rel_pos_w)
    with torch.no_grad():
        expected = x + reference_attention(block.attn, block.norm1(x), rel_pos)
        expected = expected + block.mlp(block.norm2(expected))
        torch.testing.assert_close(block(x), expected)


def test_relative_table_interpolates_like_detectron2():
    """A table made for another size is resized linearly to 2 * size - 1 rows (detectron2's
    `get_rel_pos`), then indexed by i - k + size - 1."""
    table = torch.randn(7, 4)  # made for 4 positions
    resized = F.interpolate(table.t()[None], size=5, mode="linear")[0].t()  # (5, 4)
    out = relative_table(3, 3, table)
    for i in range(3):
        for k in range(3):
            torch.testing.assert_close(out[i, k], resized[i - k + 2])
    assert torch.equal(relative_table(4, 4, table)[0, 3], table[0])


def test_rel_pos_bias_shape_and_zero_tables():
    q = torch.randn(2, 3, 12, 8)
    bias = decomposed_rel_pos_bias(q, torch.zeros(5, 8), torch.randn(7, 8), (3, 4))
    assert bias.shape == (2, 3, 12, 12)
    # keys (0, 0) and (1, 0) differ only in their row, whose table R_h is zero
    torch.testing.assert_close(bias[:, :, 0, 0], bias[:, :, 0, 4])


def test_window_partition_round_trip_on_padded_maps():
    x = torch.randn(2, 5, 7, 3)
    windows, padded = window_partition(x, 3)
    assert windows.shape == (2 * 2 * 3, 3, 3, 3) and padded == (6, 9)
    torch.testing.assert_close(windows[0], x[0, :3, :3])
    torch.testing.assert_close(windows[5, :2, :1], x[0, 3:5, 6:7])  # zero-padded at the edges
    assert windows[5, 2].abs().sum() == 0 and windows[5, :, 1:].abs().sum() == 0
    assert torch.equal(window_unpartition(windows, 3, padded, (5, 7)), x)


def test_global_blocks_keep_global_attention():
    model = VisionTransformer(**VITDET, img_size=32, window_size=2, global_blocks=(1, 3))
    assert [block.window_size for block in model.blocks] == [2, 0, 2, 0]
    assert all(isinstance(block, WindowBlock) for block in model.blocks)
    assert all(block.attn.rel_pos_h is None for block in model.blocks)


def test_one_window_over_the_whole_grid_is_the_plain_vit():
    """A window as large as the grid is global attention: the same weights give the plain
    ViT's output (no padding, no relative positions)."""
    plain = VisionTransformer(**VITDET, img_size=32)
    windowed = VisionTransformer(**VITDET, img_size=32, window_size=4)
    smaller = VisionTransformer(**VITDET, img_size=32, window_size=3)
    windowed.load_state_dict(random_(plain).state_dict())
    smaller.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(windowed.eval()(x), plain(x))
        assert not torch.allclose(smaller.eval()(x), plain(x), atol=1e-3)  # windows differ


def test_the_default_vit_builds_no_window_blocks():
    model = VisionTransformer(**TINY, img_size=32)
    assert not model.spatial_blocks and model.spatial_grid(torch.zeros(1, 3, 32, 32)) is None
    assert not any(isinstance(block, WindowBlock) for block in model.blocks)
    assert all(type(block) is onednn.layer_classes()[0] for block in model.blocks)  # fast path
    assert issubclass(onednn.layer_classes()[0], Block)
    assert not any("rel_pos" in key for key in model.state_dict())


def test_vitdet_model_on_non_square_inputs_every_path_agrees():
    model = random_(VisionTransformer(**VITDET, img_size=32, window_size=3, global_blocks=(1,),
                                      use_rel_pos=True))  # fmt: skip
    assert model.blocks[0].attn.rel_pos_h.shape == (5, 16)
    assert model.blocks[1].attn.rel_pos_h.shape == (7, 16)  # the 4 x 4 grid at img_size
    x = torch.randn(2, 3, 40, 56)  # a 5 x 7 grid: windows padded, tables interpolated
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 35, 32)
        maps = model.forward_intermediates(x, [-1], norm=True, intermediates_only=True)[0]
        torch.testing.assert_close(maps, feats.transpose(1, 2).reshape(2, 32, 5, 7))
        with_weights, weights = model.forward_features(x, return_attention=True)
        torch.testing.assert_close(with_weights, feats)
    assert weights[0].shape == (2 * 2 * 3, 2, 9, 9) and weights[1].shape == (2, 2, 35, 35)
    model.train().set_grad_checkpointing()
    out = model.forward_features(x)
    torch.testing.assert_close(out, feats)
    out.square().mean().backward()
    assert model.blocks[0].attn.rel_pos_h.grad.abs().sum() > 0
    assert model.blocks[1].attn.rel_pos_w.grad.abs().sum() > 0


def test_rel_pos_img_size_sizes_the_global_tables():
    model = VisionTransformer(**VITDET, img_size=32, use_rel_pos=True, rel_pos_img_size=64)
    assert model.blocks[0].window_size == 0
    assert model.blocks[0].attn.rel_pos_h.shape == (15, 16)  # 64 / 8 = 8 positions


def test_plain_bicubic_resampling_of_positions():
    """pos_embed_antialias=False resamples as ViTDet does: bicubic, no antialias."""
    model = random_(VisionTransformer(**VITDET, img_size=32, pos_embed_antialias=False))
    grid = model.pos_embed.reshape(1, 4, 4, 32).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(6, 3), mode="bicubic", align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(1, 18, 32)
    torch.testing.assert_close(model.position_embedding((6, 3)), expected)
    antialiased = VisionTransformer(**VITDET, img_size=32)
    antialiased.load_state_dict(model.state_dict())
    assert not torch.allclose(antialiased.position_embedding((6, 3)), expected, atol=1e-3)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(window_size=2, global_pool="avg"), "prefix tokens are not on"),
        (dict(use_rel_pos=True, class_token=False, global_pool="avg", reg_tokens=1),
         "relative positions works on the patch grid"),
        (dict(global_blocks=(1,)), "global_blocks needs window_size > 0"),
        (dict(window_size=2, global_blocks=(4,), class_token=False, global_pool="avg"),
         r"global_blocks \[4\] out of range for depth 4"),
        (dict(rel_pos_img_size=64), "rel_pos_img_size needs use_rel_pos=True"),
        (dict(window_size=2, class_token=False, global_pool="avg", res_post_norm=True),
         "needs encoder='native' and res_post_norm=False"),
    ],
)  # fmt: skip
def test_window_options_refused_with_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**TINY, img_size=32, **options)


def test_window_options_are_family_options():
    config = ViTConfig(**VITDET, img_size=32, window_size=2, global_blocks=(0,))
    assert config.family_options() == ["window_size=2", "global_blocks=(0,)"]


def test_set_input_size_keeps_the_relative_tables():
    model = VisionTransformer(**VITDET, img_size=32, use_rel_pos=True)
    model.set_input_size(64)
    assert model.config.rel_pos_img_size == 32 and model.config.img_size == 64
    rebuilt = VisionTransformer(model.config)
    rebuilt.load_state_dict(model.state_dict())  # strict: the tables keep their shapes
    assert rebuilt.blocks[0].attn.rel_pos_h.shape == (7, 16)


def test_encode_without_the_grid_says_what_to_pass():
    model = VisionTransformer(**VITDET, img_size=32, window_size=2)
    with pytest.raises(ValueError, match=r"call encode\(tokens, grid\)"):
        model.encode(torch.zeros(1, 16, 32))
