"""Every name of timm's `eva.py` (EVA, EVA-02, RoPE-ViT, Perception Encoder, DINOv3, LingBot,
Sapiens2) is a vitkit name: timm's parameter count at full depth (both on the meta device), and
at two blocks timm's perturbed state dict loads strictly and gives timm's outputs; the rotary
embeddings are timm's functions; features match timm's for an EVA-02."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, randomize, requires_timm
from vitkit import cli, create_model, list_models
from vitkit.explain.attention import attention_maps
from vitkit.model import architecture_of, get_config
from vitkit.model.layers.rope import AxialRope, CenteredRope, MixedRope, apply_rope

timm = optional_import("timm")

EVA_NAMES = sorted(n for n in list_models() if architecture_of(get_config(n)).name == "eva")
# One per distinct kind: EVA, EVA-02 (packed SwiGLU; scaled MLP, separate q/k/v), EVA-02 CLIP,
# timm's RoPE ViT with a register, PE core / lang / spatial, RoPE-ViT axial / mixed / mixed with
# absolute positions, DINOv3 (GELU; aligned SwiGLU), Sapiens2 (grouped-query attention).
# The widest run at a smaller image (their RoPE then rescales to the reference grid).
FAST = {
    "eva_giant_patch14_clip_224": {"img_size": 112},
    "eva02_tiny_patch14_224": {},
    "eva02_base_patch14_224": {"img_size": 112},
    "eva02_base_patch16_clip_224": {"img_size": 128},
    "vit_medium_patch16_rope_reg1_gap_256": {},
    "vit_pe_core_tiny_patch16_384": {},
    "vit_pe_lang_large_patch14_448": {"img_size": 112},
    "vit_pe_spatial_tiny_patch16_512": {"img_size": 256},
    "vit_small_patch16_rope_224": {},
    "vit_small_patch16_rope_mixed_224": {},
    "vit_small_patch16_rope_mixed_ape_224": {},
    "vit_small_patch16_dinov3_qkvb": {},
    "vit_small_plus_patch16_dinov3": {},
    "vit_base_patch16_sapiens2": {},
}
# Too wide to run two blocks of on CPU in a test (over ~50M parameters a block): compared on the
# meta device only (keys, shapes, counts); their kinds run in FAST / the slow sweep at smaller
# widths (enormous: post-norm; 7b and 5b: DINOv3 / Sapiens2).
META_ONLY = {"eva02_enormous_patch14_clip_224", "vit_7b_patch16_dinov3", "vit_5b_patch16_sapiens2"}


def _two_blocks(name: str) -> dict:
    """Overrides building `name` at two blocks (Sapiens2: one full and one grouped block)."""
    config = get_config(name)
    overrides = {"depth": 2}
    if config.num_kv_heads:
        overrides["num_kv_heads"] = (config.num_heads, min(config.num_kv_heads))
    return overrides


def _input(config) -> torch.Tensor:
    """A batch of two at the model's size; a model of any size gets a smaller, oblong one."""
    gen = torch.Generator().manual_seed(1)
    if config.dynamic_img_size:
        height, width = 8 * config.patch_size, 6 * config.patch_size
    else:
        height, width = (
            (config.img_size,) * 2 if isinstance(config.img_size, int) else config.img_size
        )
    return torch.randn(2, config.in_chans, height, width, generator=gen)


def _close(ours: torch.Tensor, theirs: torch.Tensor, tol: float = 1e-4) -> None:
    assert ours.shape == theirs.shape
    scale = theirs.abs().max().clamp_min(1e-6)
    assert (ours - theirs).abs().max() <= tol * scale


def _parity(name: str, **extra) -> None:
    overrides = {**_two_blocks(name), **extra}
    theirs = randomize(timm.create_model(name, pretrained=False, **overrides))
    ours = create_model(name, **overrides).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = _input(get_config(name).replace(**overrides))
    with torch.no_grad():
        features = theirs.forward_features(x)
        _close(ours.forward_features(x), features)
        _close(ours.forward_head(features), theirs.forward_head(features))
        _close(ours(x), theirs(x))


def _meta_sizes(name: str, **overrides) -> None:
    with torch.device("meta"):
        ours = create_model(name, **overrides)
        theirs = timm.create_model(name, pretrained=False, **overrides)
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert ours.num_classes == theirs.num_classes
    assert ours.patch_embed.img_size == tuple(theirs.patch_embed.img_size)


@requires_timm
def test_the_names_are_timms_eva_names():
    assert EVA_NAMES == sorted(timm.list_models(module="eva")) and len(EVA_NAMES) == 65
    assert list_models("eva02*") == sorted(timm.list_models("eva02*"))


@requires_timm
@pytest.mark.parametrize("name", FAST)
def test_outputs_equal_timms(name):
    _parity(name, **FAST[name])


@requires_timm
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(EVA_NAMES) - set(FAST) - META_ONLY))
def test_outputs_equal_timms_every_name(name):
    _parity(name)


@requires_timm
@pytest.mark.slow
@pytest.mark.parametrize("name", EVA_NAMES)
def test_parameter_counts_and_keys_equal_timms(name):
    _meta_sizes(name)


@requires_timm
@pytest.mark.parametrize("name", sorted(META_ONLY))
def test_the_widest_at_two_blocks_equal_timms_keys(name):
    _meta_sizes(name, **_two_blocks(name))


def test_known_counts():
    """timm 1.0.31's counts, without timm."""
    with torch.device("meta"):
        counts = {
            n: sum(p.numel() for p in create_model(n).parameters())
            for n in (
                "eva02_small_patch14_224",
                "vit_7b_patch16_dinov3",
                "vit_base_patch16_sapiens2",
            )
        }
    assert counts == {
        "eva02_small_patch14_224": 21_621_120,
        "vit_7b_patch16_dinov3": 6_716_030_976,
        "vit_base_patch16_sapiens2": 113_993_472,
    }


@requires_timm
def test_features_and_intermediates_equal_timms():
    name = "eva02_tiny_patch14_224"
    theirs = randomize(timm.create_model(name, pretrained=False, depth=4))
    ours = create_model(name, depth=4).eval()
    ours.load_state_dict(theirs.state_dict())
    x = _input(get_config(name))
    with torch.no_grad():
        final, inter = ours.forward_intermediates(x, indices=[1, 3], norm=True)
        t_final, t_inter = theirs.forward_intermediates(x, indices=[1, 3], norm=True)
        _close(final, t_final)
        for a, b in zip(inter, t_inter, strict=True):
            _close(a, b)
        ours_fo = create_model(name, depth=4, features_only=True, out_indices=(1, 2)).eval()
        theirs_fo = timm.create_model(
            name, pretrained=False, depth=4, features_only=True, out_indices=(1, 2)
        ).eval()
        for net in (theirs_fo.model, ours_fo.model):  # the blocks the maps need
            keys = net.state_dict()
            net.load_state_dict({k: v for k, v in theirs.state_dict().items() if k in keys})
        maps = ours_fo(x)
        for a, b in zip(maps, theirs_fo(x), strict=True):
            _close(a, b)
    assert ours_fo.feature_info.channels() == theirs_fo.feature_info.channels()
    assert ours_fo.feature_info.reduction() == theirs_fo.feature_info.reduction()


@requires_timm
@requires_timm
def test_set_input_size_equals_timms():
    name = "vit_small_patch16_rope_mixed_ape_224"  # positions on the patches only, RoPE-Mixed
    theirs = randomize(timm.create_model(name, pretrained=False, depth=2))
    ours = create_model(name, depth=2).eval()
    ours.load_state_dict(theirs.state_dict())
    for model in (ours, theirs):
        model.set_input_size(img_size=160, patch_size=20)
    x = torch.randn(1, 3, 160, 160, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _close(ours(x), theirs(x))
    assert ours.feature_info[0]["reduction"] == 20  # the maps' stride (timm keeps the old one)


@requires_timm
def test_rope_embeddings_equal_timms():
    from timm.layers import pos_embed_sincos as sincos

    axial = sincos.RotaryEmbeddingCat(
        dim=32, in_pixels=False, temperature=10000, feat_shape=None, ref_feat_shape=(16, 16),
        grid_offset=1.0, grid_indexing="xy",
    )  # fmt: skip
    _close(
        AxialRope(32, offset=1.0, indexing="xy", ref_grid=(16, 16))((7, 5)), axial.get_embed((7, 5))
    )
    dino = sincos.RotaryEmbeddingDinoV3(dim=32, temperature=100, rotate_half=True)
    _close(CenteredRope(32, temperature=100)((6, 9)), dino.get_embed((6, 9)), 1e-6)
    mixed = MixedRope(32, depth=3, num_heads=2)
    theirs = sincos.RotaryEmbeddingMixed(dim=64, depth=3, num_heads=2, grid_indexing="xy")
    with torch.no_grad():
        theirs.freqs.copy_(mixed.freqs)
        _close(mixed((4, 5)), theirs.get_embed((4, 5)), 1e-6)
    x, embed = torch.randn(2, 3, 20, 32), dino.get_embed((4, 5))
    for half in (False, True):
        _close(apply_rope(x, embed, half), sincos.apply_rot_embed_cat(x, embed, half=half), 1e-6)


def test_attention_weights_are_the_forward_softmax():
    """The explanation reads each block's weights: the explicit path gives the same output."""
    model = randomize(create_model("vit_small_patch16_rope_mixed_224", depth=2))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        logits, attentions = model(x, return_attention=True)
        _close(logits, model(x), 1e-5)
    assert len(attentions) == 2 and attentions[0].shape == (1, 6, 197, 197)
    assert torch.allclose(attentions[0].sum(-1), torch.ones(1, 6, 197))
    maps = attention_maps(model, x)  # what `vitkit explain` draws
    assert maps["relevance"].shape == maps["rollout"].shape == (1, 14, 14)


def test_options_are_checked():
    with pytest.raises(ValueError, match="one per block"):
        create_model("vit_base_patch16_sapiens2", depth=2)
    with pytest.raises(ValueError, match="multiple of 4"):
        create_model("eva02_tiny_patch14_224", embed_dim=198, num_heads=3)


def test_vitkit_models_lists_them(capsys):
    assert cli.main(["models", "eva02_tiny*"]) == 0
    assert capsys.readouterr().out.split() == ["eva02_tiny_patch14_224", "eva02_tiny_patch14_336"]
