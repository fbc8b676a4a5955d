"""timm's ViTs with other blocks (parallel blocks, differential attention), its test models
and the SigLIP at 384 pixels in patches of 14: timm's parameters, timm's outputs."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import convert
from vitkit.model.layers.diff_attention import DiffAttention
from vitkit.model.layers.parallel import ParallelScalingBlock, ParallelThingsBlock

timm = optional_import("timm")

# Every name of the families, with the timm block class it uses.
BLOCK_NAMES = {
    "vit_small_patch16_18x2_224": "ParallelThingsBlock",
    "vit_base_patch16_18x2_224": "ParallelThingsBlock",
    "vit_base_patch16_xp_224": "ParallelScalingBlock",
    "vit_large_patch14_xp_224": "ParallelScalingBlock",
    "vit_huge_patch14_xp_224": "ParallelScalingBlock",
    "vit_pwee_patch16_reg1_gap_256": "ParallelScalingBlock",
    "vit_dpwee_patch16_reg1_gap_256": "DiffParallelScalingBlock",
    "vit_dwee_patch16_reg1_gap_256": "Block",  # with DiffAttention
    "vit_dlittle_patch16_reg1_gap_256": "Block",
    "deit_tiny_distilled_patch16_224": "Block",  # VisionTransformerDistilled
    "deit_base_distilled_patch16_384": "Block",
    "test_vit": "Block",
    "test_vit2": "Block",
    "test_vit3": "Block",
    "test_vit4": "Block",
    "vit_so400m_patch14_siglip_384": "Block",
    "vit_so400m_patch14_siglip_gap_384": "Block",
}
# Whether the weights alone tell the architecture (else the name supplies what they cannot:
# norm_pre's epsilon, the attention pool's activation, RMSNorm's epsilon).
REPRESENTATIVES = {
    "vit_small_patch16_18x2_224": True,
    "vit_base_patch16_xp_224": False,
    "vit_pwee_patch16_reg1_gap_256": True,
    "vit_dpwee_patch16_reg1_gap_256": True,
    "vit_dwee_patch16_reg1_gap_256": True,
    "test_vit3": False,
}


def _timm_small(name: str, **options) -> torch.nn.Module:
    """timm's `name` at depth 2 (the differential lambdas depend on the block index), width
    96, a 4 x 4 grid, every weight perturbed."""
    torch.manual_seed(0)
    options = {"depth": 2, "img_size": 64, "embed_dim": 96, "num_heads": 4, **options}
    return randomize(timm.create_model(name, **options))


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def _check_names(names: list[str]) -> None:
    for name in names:
        block = BLOCK_NAMES[name]
        with torch.device("meta"):
            theirs = timm.create_model(name)
            ours = vitkit.create_model(name)
        assert type(theirs.blocks[0]).__name__ == block, name
        shapes = {k: v.shape for k, v in theirs.state_dict().items()}
        assert {k: v.shape for k, v in ours.state_dict().items()} == shapes, name


@requires_timm
def test_the_small_names_are_timms_with_its_block_and_parameters():
    _check_names([n for n in BLOCK_NAMES if vitkit.get_config(n).embed_dim <= 320])


@requires_timm
@pytest.mark.slow
def test_every_name_is_timms_with_its_block_and_parameters():
    _check_names(list(BLOCK_NAMES))


@requires_timm
@pytest.mark.parametrize("name, from_weights", REPRESENTATIVES.items())
def test_each_family_loads_timms_weights_with_timms_outputs(name, from_weights):
    source = _timm_small(name)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    loads = [dict(arch=name)] + ([{}] if from_weights else [])
    with torch.no_grad():
        expected = source(x)
        for options in loads:
            model = vitkit.load_pretrained(source.state_dict(), num_heads=4, **options)
            assert _relative_error(model(x), expected) < 1e-6, (name, options)
            logits, maps = model(x, return_attention=True)  # the explicit path: the same
            assert _relative_error(logits, expected) < 1e-5
            rebuilt = convert.source_model("timm", model.config, convert.to_timm(model))
            assert type(rebuilt.blocks[0]) is type(source.blocks[0])
            assert _relative_error(rebuilt(x), expected) < 1e-6
            tokens = 16 + model.num_prefix_tokens
            assert len(maps) == 2 and maps[0].shape == (2, 4, tokens, tokens)


def test_the_differential_map_is_the_difference_of_two_softmax_maps():
    torch.manual_seed(0)
    attn = DiffAttention(32, num_heads=2, depth=3).eval()
    assert attn.lambda_init == pytest.approx(0.8 - 0.6 * torch.exp(torch.tensor(-0.9)).item())
    x = torch.randn(2, 5, 32)
    out, weights = attn.forward_with_weights(x)
    torch.testing.assert_close(attn(x), out, rtol=1e-5, atol=1e-6)  # SDPA path = explicit
    q, k, _ = attn.qkv(x).chunk(3, dim=-1)
    q = q.reshape(2, 5, 4, 8).transpose(1, 2)  # 2 heads x 2 halves of 8
    k = k.reshape(2, 5, 4, 8).transpose(1, 2)
    maps = (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1)  # (B, 4, N, N)
    lam = attn.diff_lambda()
    torch.testing.assert_close(weights, maps[:, 0::2] - lam * maps[:, 1::2])


def test_parallel_blocks_sum_their_branches():
    torch.manual_seed(0)
    block = randomize(ParallelThingsBlock(32, num_heads=4, init_values=0.5))
    x = torch.randn(2, 5, 32)
    y = x + block.attns[0](x) + block.attns[1](x)
    torch.testing.assert_close(block(x), y + block.ffns[0](y) + block.ffns[1](y))
    scaling = randomize(ParallelScalingBlock(32, num_heads=4, qkv_bias=False))
    assert scaling.mlp_bias is not None  # the MLP's input bias, apart from the bias-free qkv
    torch.testing.assert_close(scaling(x), scaling.forward_with_weights(x)[0])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(block="parallel_things", attn_layer="diff"), r"has plain attention only"),
        (dict(block="parallel_scaling", scale_attn_norm=True), r"fuses a plain MLP"),
        (dict(attn_layer="diff", res_post_norm=True), r"are pre-norm blocks with global"),
        (dict(block="parallel_scaling", encoder="torch"), r"^encoder='torch' .* block="),
    ],
)
def test_what_timms_blocks_do_not_have_is_refused(options, message):
    with pytest.raises(ValueError, match=message):
        vitkit.ViTConfig(**options)


def test_weights_without_positions_take_the_size_of_their_name_floored_as_named():
    name = "vit_so400m_patch14_siglip_384"
    source = vitkit.create_model(name, depth=1, embed_dim=64, num_heads=4, pos_embed="none")
    model = vitkit.load_pretrained(source.state_dict(), arch=name, num_heads=4)
    assert (model.config.img_size, model.config.floor_grid) == (384, True)
    assert model.patch_embed.grid_size == (27, 27)


@requires_timm
def test_384_pixels_in_patches_of_14_floor_the_grid_as_timm():
    name = "vit_so400m_patch14_siglip_384"
    source = _timm_small(name, depth=1, img_size=384)
    assert source.patch_embed.grid_size == (27, 27)  # the last 6 pixels dropped
    model = vitkit.load_pretrained(source.state_dict(), arch=name, num_heads=4)
    assert (model.config.img_size, model.patch_embed.grid_size) == (384, (27, 27))
    x = torch.randn(1, 3, 384, 384, generator=torch.Generator().manual_seed(1))
    x_cut = x.clone()
    x_cut[..., 378:, :] = 0  # pixels the convolution never reads
    x_cut[..., :, 378:] = 0
    with torch.no_grad():
        assert _relative_error(model(x), source(x)) < 1e-6
        torch.testing.assert_close(model(x_cut), model(x))
    # The same weights without the name are the 378-pixel model; other sizes are refused,
    # as timm refuses them under dynamic_img_size.
    unnamed = vitkit.load_pretrained(source.state_dict(), act_layer="gelu_tanh", num_heads=4)
    assert unnamed.config.img_size == 378
    with pytest.raises(ValueError, match=r"img_size height 384 is not divisible by patch_size"):
        vitkit.VisionTransformer(img_size=384, patch_size=14)
    dynamic = vitkit.create_model(name, depth=1, embed_dim=64, dynamic_img_size=True)
    with pytest.raises(ValueError, match=r"^input height 384 is not divisible by patch size 14"):
        dynamic(x)
