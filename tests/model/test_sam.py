"""Every name of timm's `vision_transformer_sam.py` is a vitkit name with timm's parameter count
and keys (on the meta device); on tiny configs timm's perturbed state dict loads strictly and
gives timm's features, logits and intermediates at the native size and at others (position map
and relative-position tables resampled); the decomposed relative positions of layers/window.py
are timm's `get_decomposed_rel_pos_bias`."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, randomize, requires_timm
from vitkit import create_model, list_models
from vitkit.model import architecture_of, get_config
from vitkit.model.layers.window import decomposed_rel_pos_bias
from vitkit.model.sam import SamConfig, SamViT

timm = optional_import("timm")

SAM_NAMES = sorted(n for n in list_models() if architecture_of(get_config(n)).name == "sam")
TINY = dict(img_size=64, patch_size=8, embed_dim=64, depth=2, num_heads=2, window_size=4,
            global_attn_indexes=(1,), neck_chans=32, use_rel_pos=True)  # fmt: skip
COUNTS = {
    "samvit_base_patch16": 89_670_912,
    "samvit_base_patch16_224": 86_457_064,
    "samvit_large_patch16": 308_278_272,
    "samvit_huge_patch16": 637_026_048,
}
KINDS = {
    "encoder": {},
    "encoder with a head": dict(num_classes=5),
    "224 classifier": dict(neck_chans=0, use_abs_pos=False, num_classes=7),
    "odd windows, qk_norm, LayerScale": dict(
        qk_norm=True, init_values=0.1, pre_norm=True, num_classes=3, global_pool="max",
        window_size=3,
    ),
}  # fmt: skip


def _pair(options: dict) -> tuple[torch.nn.Module, SamViT]:
    """timm's model of `options` with perturbed weights, and vitkit's holding them."""
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    torch.manual_seed(0)
    reference = randomize(VisionTransformerSAM(**{"num_classes": 0, **options}))
    ours = SamViT(**options).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


@requires_timm
def test_every_timm_name_is_registered():
    assert SAM_NAMES == sorted(timm.list_models(module="vision_transformer_sam"))


@requires_timm
@pytest.mark.parametrize("name", SAM_NAMES)
def test_timm_parameter_count_and_keys(name):
    with torch.device("meta"):
        reference, ours = timm.create_model(name), create_model(name)
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == theirs
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in reference.parameters())
    assert count == COUNTS[name]


@requires_timm
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_equal_timms(kind):
    reference, ours = _pair({**TINY, **KINDS[kind]})
    for size in (64, 48, 80):  # native; smaller and larger: positions and tables resampled
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            torch.testing.assert_close(
                ours.forward_features(x), reference.forward_features(x), atol=1e-5, rtol=0
            )
            torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)
            features = ours.forward_features(x)
            torch.testing.assert_close(
                ours.forward_head(features, pre_logits=True),
                reference.forward_head(features, pre_logits=True),
                atol=1e-5,
                rtol=0,
            )


@requires_timm
@pytest.mark.parametrize("norm", [False, True])
def test_intermediates_equal_timms(norm):
    reference, ours = _pair(TINY)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, maps = ours.forward_intermediates(x, [0, 1], norm=norm)
        their_final, theirs = reference.forward_intermediates(x, [0, 1], norm=norm)
        early = ours.forward_intermediates(
            x, 1, norm=norm, intermediates_only=True, stop_early=True
        )
    torch.testing.assert_close(final, their_final, atol=1e-5, rtol=0)
    assert len(maps) == 2 and maps[0].shape == (1, 32 if norm else 64, 8, 8)
    for mine, their in zip(maps, theirs, strict=True):
        torch.testing.assert_close(mine, their, atol=1e-5, rtol=0)
    torch.testing.assert_close(early[0], theirs[1], atol=1e-5, rtol=0)


@requires_timm
@pytest.mark.parametrize("size", [(4, 4), (6, 5)])
def test_decomposed_rel_pos_bias_is_timms(size):
    """The bias of tables made for 4 x 4 (7 rows), read at the grid of the table and at another
    (linearly interpolated), equals timm's function's."""
    from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias

    gen = torch.Generator().manual_seed(3)
    rel_h, rel_w = torch.randn(7, 8, generator=gen), torch.randn(7, 8, generator=gen)
    q = torch.randn(2, 3, size[0] * size[1], 8, generator=gen)  # (B, heads, N, C)
    ours = decomposed_rel_pos_bias(q, rel_h, rel_w, size)
    theirs = get_decomposed_rel_pos_bias(q.reshape(6, -1, 8), rel_h, rel_w, size, size)
    torch.testing.assert_close(ours.reshape(6, *theirs.shape[1:]), theirs, atol=1e-6, rtol=0)


def test_features_only_reads_block_maps():
    backbone = create_model("samvit_base_patch16", features_only=True, **{**TINY, "depth": 3})
    maps = backbone(torch.randn(1, 3, 64, 64))
    assert [tuple(m.shape) for m in maps] == [(1, 64, 8, 8)] * 3
    assert isinstance(backbone.model.neck, torch.nn.Identity)


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match="embed_dim 64 is not divisible by num_heads 3; choose"):
        SamConfig(embed_dim=64, num_heads=3)
    with pytest.raises(ValueError, match="a classifier needs a pooled vector"):
        SamConfig(num_classes=10, global_pool="none")
    with pytest.raises(ValueError, match="output_fmt='NCHW'"):
        SamViT(**TINY).forward_intermediates(torch.randn(1, 3, 64, 64), output_fmt="NLC")


def test_reset_classifier_and_pretrained_cfg():
    model = SamViT(**TINY)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 32)  # the pooled neck
    model.reset_classifier(10)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    cfg = model.pretrained_cfg
    assert cfg["classifier"] == "head.fc" and cfg["mean"] == (0.485, 0.456, 0.406)
    assert cfg["input_size"] == (3, 64, 64) and cfg["num_classes"] == 10
