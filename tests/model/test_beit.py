"""Every name of timm's `beit.py` (BEiT, BEiT v2) is a vitkit name with timm's parameter count
and keys (on the meta device); timm's randomised state dicts load strictly and give timm's
outputs (tiny configs of every option, and registered names at a small input); the relative
position index and the table resize are timm's functions; features, attention weights and a
new input size match."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_timm
from vitkit import cli, create_model, list_models
from vitkit.model import architecture_of, get_config
from vitkit.model.beit import Beit, BeitConfig
from vitkit.model.layers.rel_pos_bias import (
    CLASS_ROWS,
    RelativePositionBias,
    relative_position_index,
    resize_rel_pos_bias_table,
)

timm = optional_import("timm")

BEIT_NAMES = sorted(n for n in list_models() if architecture_of(get_config(n)).name == "beit")
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=5)
OPTIONS = {
    "per-block tables, LayerScale": dict(use_abs_pos_emb=False, use_rel_pos_bias=True,
                                         init_values=0.1),
    "shared table, class token": dict(use_shared_rel_pos_bias=True, global_pool="token"),
    "both tables, SwiGLU, no q/v bias": dict(use_rel_pos_bias=True, use_shared_rel_pos_bias=True,
                                             swiglu_mlp=True, scale_mlp=True, qkv_bias=False,
                                             init_values=1e-2),
    "absolute positions only, fc_norm off": dict(use_fc_norm=False, mlp_ratio=3.0),
    "oblong grid": dict(img_size=(32, 48), use_rel_pos_bias=True, init_values=0.5),
}  # fmt: skip
# Registered names at two blocks and a small input (their tables are made for its grid).
NAMED = {
    "beit_base_patch16_224": dict(depth=2, img_size=64),
    "beitv2_base_patch16_224": dict(depth=2, img_size=48, num_classes=10),
    "beit_large_patch16_512": dict(depth=1, img_size=32),
}


def _compare(ours: Beit, theirs, x: torch.Tensor, tol: float = 1e-5) -> None:
    ours.load_state_dict(theirs.state_dict(), strict=True)
    with torch.no_grad():
        features = theirs.forward_features(x)
        torch.testing.assert_close(ours.forward_features(x), features, atol=tol, rtol=0)
        torch.testing.assert_close(
            ours.forward_head(features), theirs.forward_head(features), atol=tol, rtol=0
        )
        torch.testing.assert_close(ours(x), theirs(x), atol=tol, rtol=0)


@requires_timm
def test_the_names_are_timms_beit_names():
    assert BEIT_NAMES == sorted(timm.list_models(module="beit")) and len(BEIT_NAMES) == 7


@requires_timm
@pytest.mark.parametrize("name", BEIT_NAMES)
def test_parameter_counts_and_keys_equal_timms(name):
    with torch.device("meta"):
        ours = create_model(name)
        theirs = timm.create_model(name, pretrained=False)
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    if name == "beit_base_patch16_224":
        assert sum(p.numel() for p in ours.parameters()) == 86_530_984


@requires_timm
@pytest.mark.parametrize("options", OPTIONS.values(), ids=list(OPTIONS))
def test_a_timm_beit_loads_and_computes_the_same(options):
    from timm.models.beit import Beit as TimmBeit

    config = {**TINY, **options}
    theirs = randomize(TimmBeit(**config))
    ours = Beit(**config).eval()
    height, width = (config["img_size"],) * 2 if isinstance(config["img_size"], int) else (
        config["img_size"])  # fmt: skip
    x = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(1))
    _compare(ours, theirs, x)


@requires_timm
@pytest.mark.parametrize("name", NAMED)
def test_registered_names_give_timms_outputs(name):
    overrides = NAMED[name]
    theirs = randomize(timm.create_model(name, pretrained=False, **overrides))
    ours = create_model(name, **overrides).eval()
    side = overrides["img_size"]
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(2))
    _compare(ours, theirs, x)


@requires_timm
def test_intermediates_equal_timms():
    from timm.models.beit import Beit as TimmBeit

    config = {**TINY, **OPTIONS["both tables, SwiGLU, no q/v bias"], "depth": 3}
    theirs = randomize(TimmBeit(**config))
    ours = Beit(**config).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for kwargs in (dict(indices=2), dict(indices=[0, 2], norm=True, output_fmt="NLC")):
            final, feats = ours.forward_intermediates(x, **kwargs)
            their_final, their_feats = theirs.forward_intermediates(x, **kwargs)
            torch.testing.assert_close(final, their_final, atol=1e-5, rtol=0)
            for mine, their in zip(feats, their_feats, strict=True):
                torch.testing.assert_close(mine, their, atol=1e-5, rtol=0)
        prefixed = ours.forward_intermediates(
            x, [1], return_prefix_tokens=True, intermediates_only=True
        )
        assert prefixed[0][0].shape == (2, 64, 4, 4) and prefixed[0][1].shape == (2, 1, 64)


@requires_timm
def test_the_relative_position_index_is_timms():
    from timm.models.beit import gen_relative_position_index

    for grid in ((3, 3), (2, 5)):
        assert torch.equal(
            relative_position_index(grid, class_token=True), gen_relative_position_index(grid)
        )


@requires_timm
@pytest.mark.parametrize(
    "old, new", [((4, 4), (6, 6)), ((5, 5), (3, 3)), ((2, 3), (4, 5)), ((4, 4), (4, 6))]
)
def test_the_table_resize_is_timms(old, new):
    from timm.layers import resize_rel_pos_bias_table as timm_resize

    rows = (2 * old[0] - 1) * (2 * old[1] - 1) + CLASS_ROWS
    table = torch.randn(rows, 3, generator=torch.Generator().manual_seed(0))
    shape = ((2 * new[0] - 1) * (2 * new[1] - 1) + CLASS_ROWS, 3)
    theirs = timm_resize(table, new_window_size=new, new_bias_shape=shape, old_window_size=old)
    ours = resize_rel_pos_bias_table(table, new, old, extra_rows=CLASS_ROWS)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    if old[0] == old[1]:  # a checkpoint's square table without its window: timm's assumption
        theirs = timm_resize(table, new_window_size=new, new_bias_shape=shape)
        torch.testing.assert_close(resize_rel_pos_bias_table(table, new, extra_rows=3), theirs)


def test_a_table_of_no_square_grid_needs_its_window():
    table = torch.zeros((2 * 2 - 1) * (2 * 3 - 1) + CLASS_ROWS, 2)
    with pytest.raises(ValueError, match="^a bias table of 15 offsets is not that of a square"):
        resize_rel_pos_bias_table(table, (4, 4), extra_rows=CLASS_ROWS)


def test_the_shared_table_gives_each_pair_of_tokens_its_offsets_bias():
    shared = RelativePositionBias((2, 2), num_heads=1)
    with torch.no_grad():
        shared.relative_position_bias_table.copy_(torch.arange(12.0)[:, None])
    bias = shared()[0]  # (5, 5): the class token, then a 2 x 2 grid
    assert bias.shape == (5, 5)
    assert bias[0, 0] == 11 and bias[0, 1] == 9 and bias[1, 0] == 10  # class rows
    assert bias[1, 1] == 4 and bias[1, 2] == 3  # offset (0, 0) is row 4 of a 3 x 3 table


@requires_timm
def test_a_new_input_size_resizes_as_timms():
    from timm.models.beit import Beit as TimmBeit

    config = {**TINY, **OPTIONS["both tables, SwiGLU, no q/v bias"], "use_abs_pos_emb": True}
    theirs = randomize(TimmBeit(**config))
    ours = Beit(**config).eval()
    ours.load_state_dict(theirs.state_dict())
    theirs.set_input_size(img_size=(48, 40))
    ours.set_input_size(img_size=(48, 40))
    _compare(ours, theirs, torch.randn(1, 3, 48, 40))
    assert ours.blocks[0].attn.relative_position_index.shape == (31, 31)


def test_the_attention_weights_are_those_the_forward_pass_uses():
    torch.manual_seed(0)
    model = randomize(Beit(**TINY, use_rel_pos_bias=True, use_shared_rel_pos_bias=True))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits, weights = model(x, return_attention=True)
        torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=0)
    assert len(weights) == 2 and weights[0].shape == (2, 2, 17, 17)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, 2, 17))


def test_a_width_the_heads_do_not_divide_is_refused():
    with pytest.raises(ValueError, match="^embed_dim 64 is not divisible by num_heads 3; choose"):
        BeitConfig(embed_dim=64, num_heads=3)


def test_a_backbone_gives_maps_of_the_blocks_asked_for():
    backbone = create_model("beitv2_base_patch16_224", features_only=True, depth=3, img_size=32,
                            embed_dim=64, num_heads=2, out_indices=(0, 2))  # fmt: skip
    maps = backbone(torch.randn(2, 3, 32, 32))
    assert [tuple(m.shape) for m in maps] == [(2, 64, 2, 2)] * 2
    assert len(backbone.model.blocks) == 3  # pruned after the last block asked for


def test_a_registered_name_trains_on_the_digits_with_its_own_options(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "beitv2_base_patch16_224", "--model-opt", "depth=2",
            "--model-opt", "embed_dim=64", "--model-opt", "num_heads=2",
            "--model-opt", "use_shared_rel_pos_bias=true", "--img-size", "32", "--epochs", "1",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[-1].startswith("test accuracy: ")
    model = vitkit.load(out / "model.safetensors")
    assert type(model) is Beit and model.config.img_size == 32 and model.num_classes == 10
    assert model.rel_pos_bias is not None and model.blocks[1].attn.window_size == (2, 2)
