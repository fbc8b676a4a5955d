"""Every name of timm's `vision_transformer_relpos.py` is a vitkit name with timm's parameter
count and keys (on the meta device); at two blocks timm's perturbed state dict loads strictly and
gives timm's features, logits and intermediates for each kind (per-block and shared MLP bias,
class token and its pools, post-norm blocks, Swin V2's 'swin' mode); the bias layer is timm's
`RelPosMlp`."""

from __future__ import annotations

import pytest
import torch

from _helpers import optional_import, randomize, requires_timm
from vitkit import create_model, list_models
from vitkit.explain.attention import attention_maps, readout_of
from vitkit.model import architecture_of, get_config
from vitkit.model.layers.rel_pos_mlp import RelPosMlp
from vitkit.model.relpos import RelPosConfig

timm = optional_import("timm")

RELPOS_NAMES = sorted(n for n in list_models() if architecture_of(get_config(n)).name == "relpos")
SMALL = dict(depth=2, embed_dim=48, num_heads=3, img_size=64)
KINDS = {
    "vit_relpos_small_patch16_224": {},  # per-block MLP, fc_norm
    "vit_srelpos_small_patch16_224": {},  # one shared MLP
    "vit_relpos_medium_patch16_cls_224": {},  # class token pooled
    "vit_relpos_base_patch16_clsgap_224": {},  # class token, average of the patches
    "vit_relpos_small_patch16_rpn_224": {},  # post-norm blocks
    "vit_relpos_base_patch16_224": {"rel_pos_type": "mlp_swin", "qk_norm": True},
}


@requires_timm
def test_every_timm_name_is_registered():
    assert RELPOS_NAMES == sorted(timm.list_models(module="vision_transformer_relpos"))
    assert len(RELPOS_NAMES) == 14


@requires_timm
@pytest.mark.parametrize("name", RELPOS_NAMES)
def test_timm_parameter_count_and_keys(name):
    with torch.device("meta"):
        reference, ours = timm.create_model(name), create_model(name)
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == theirs
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in reference.parameters())


@requires_timm
@pytest.mark.parametrize("name", KINDS)
def test_outputs_equal_timms(name):
    options = {**SMALL, **KINDS[name]}
    torch.manual_seed(0)
    reference = randomize(timm.create_model(name, **options))
    ours = create_model(name, **options).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            ours.forward_features(x), reference.forward_features(x), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=0)
        mine = ours.forward_intermediates(x, [0, 1], intermediates_only=True)
        theirs = reference.forward_intermediates(x, [0, 1], intermediates_only=True)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@requires_timm
@pytest.mark.parametrize("mode, prefix", [("cr", 0), ("cr", 1), ("swin", 0)])
def test_the_bias_is_timms_rel_pos_mlp(mode, prefix):
    from timm.layers.pos_embed_rel import RelPosMlp as TimmRelPosMlp

    theirs = TimmRelPosMlp((3, 4), num_heads=2, hidden_dim=16, prefix_tokens=prefix, mode=mode)
    ours = RelPosMlp((3, 4), num_heads=2, hidden_dim=16, prefix_tokens=prefix, mode=mode)
    ours.load_state_dict(randomize(theirs).state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval().get_bias(), theirs.get_bias(), atol=1e-6, rtol=0)
    assert ours.get_bias().shape == (1, 2, 12 + prefix, 12 + prefix)


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match="^global_pool='token' needs class_token=True$"):
        RelPosConfig(global_pool="token")
    with pytest.raises(ValueError, match="embed_dim 64 is not divisible by num_heads 3; choose"):
        RelPosConfig(embed_dim=64, num_heads=3)
    model = create_model("vit_relpos_small_patch16_224", **SMALL)
    with pytest.raises(ValueError, match="input size 48x48 differs from the model's img_size"):
        model(torch.randn(1, 3, 48, 48))


@pytest.mark.parametrize("name, options", list(KINDS.items()), ids=list(KINDS))
def test_attention_weights_are_the_ones_the_forward_pass_uses(name, options):
    """The explanation reads each block's weights (the softmax of the biased scores): the
    explicit path that returns them gives the fused path's logits, and `vitkit explain`'s
    maps read the class token's row where the head pools it, the patch rows' mean else."""
    torch.manual_seed(0)
    model = randomize(create_model(name, **SMALL, **options)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits, attentions = model(x, return_attention=True)
        torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    tokens = 16 + model.num_prefix_tokens
    assert [a.shape for a in attentions] == [(2, 3, tokens, tokens)] * 2
    torch.testing.assert_close(attentions[1].sum(-1), torch.ones(2, 3, tokens))
    maps = attention_maps(model, x)
    assert maps["relevance"].shape == maps["rollout"].shape == (2, 4, 4)
    assert readout_of(model) == ("class" if model.global_pool == "token" else "mean")
