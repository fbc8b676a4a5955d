"""`vitkit summary --flow` on the EVA and BEiT families: each stage's shape is the one the model
computes (its hooks, attention maps, pooled features and logits), the stages own every
parameter once, and the table is as wide as a ViT's."""

import pytest
import torch

from vitkit import VisionTransformer
from vitkit.cli import main
from vitkit.model.beit import Beit
from vitkit.model.eva import Eva
from vitkit.summary import flow

TINY = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5)
EVAS = {
    "eva02": dict(use_rot_pos_emb=True, swiglu_mlp=True, scale_mlp=True, mlp_ratio=2.0),
    "dinov3": dict(use_rot_pos_emb=True, rope_type="dinov3", num_reg_tokens=4,
                   use_abs_pos_emb=False, init_values=1e-5, global_pool="token"),
    "pe": dict(use_rot_pos_emb=True, global_pool="map", use_pre_transformer_norm=True,
               attn_type="rope", class_token=False),
}  # fmt: skip
BEITS = {
    "per-block": dict(init_values=0.1, use_rel_pos_bias=True, use_abs_pos_emb=False),
    "shared": dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True, global_pool="token"),
}


def measured(model, size):
    """The model's own shapes: block 1's output and its attention maps, the rotary table, the
    pooled features and the logits."""
    x, seen = torch.zeros(size), {}

    def keep(name: str, output: torch.Tensor) -> None:
        seen.setdefault(name, tuple(output.shape))

    hooks = [
        model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: keep(name, o))
        for name in ("blocks.1", "rope")
        if name != "rope" or getattr(model, "rope", None) is not None
    ]
    with torch.no_grad():
        logits = model(x)
        for hook in hooks:
            hook.remove()
        _, maps = model(x, return_attention=True)
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    return seen, tuple(maps[1].shape), tuple(pooled.shape), tuple(logits.shape)


def check_walk(model, size):
    result = flow(model, size)
    seen, attention, pooled, logits = measured(model, size)
    rows = {(r.block, r.role): r for r in result.rows}
    assert rows[(1, "attention logits")].shape == rows[(1, "softmax")].shape == attention
    residuals = [r for r in result.rows if (r.block, r.role) == (1, "residual")]
    assert residuals[-1].shape == seen["blocks.1"]
    assert rows[(None, "pooling")].shape == pooled and result.rows[-1].shape == logits
    total = sum(p.numel() for p in model.parameters())
    assert sum(r.params or 0 for r in result.rows) == result.total_params == total
    return result, rows, seen


@pytest.mark.parametrize("kind", EVAS)
def test_the_eva_walk_measures_rope_registers_and_pooling(kind):
    torch.manual_seed(0)
    model = Eva(**TINY, **EVAS[kind])
    result, rows, seen = check_walk(model, (2, 3, 32, 32))
    prefix = model.num_prefix_tokens  # class and registers
    tokens = prefix + 16
    assert result.tokens == tokens and result.patches == 16 and result.grid == (4, 4)
    assert rows[(1, "residual")].shape == (2, tokens, 24) == seen["blocks.1"]
    assert rows[(None, "rotary table")].shape == seen["rope"] == (16, 24)  # (P, 2 * hd)
    assert rows[(1, "rotary positions")].shape == (2, 2, tokens, 12)  # (B, heads, N, hd)
    roles = [r.role for r in result.rows if r.block == 0]
    assert roles.index("split heads") < roles.index("rotary positions")
    assert roles.index("rotary positions") < roles.index("attention logits")
    assert "RoPE" in result.encoder
    if kind == "dinov3":
        concat = rows[(None, "token concat")]
        assert concat.stage == "cls_token + reg_token" and concat.shape == (2, 21, 24)
        assert concat.detail == "prepend the class and register tokens to the patches"
        assert rows[(0, "layer scale")].params == 24
        assert "position add" not in [r.role for r in result.rows]
        assert result.encoder == "EVA, centred RoPE"
    if kind == "pe":
        pool = rows[(None, "pooling")]
        assert (pool.stage, pool.shape) == ("attn_pool", (2, 24))
        assert pool.params == sum(p.numel() for p in model.attn_pool.parameters())
        assert rows[(None, "norm before the blocks")].shape == (2, 16, 24)
    if kind == "eva02":
        assert rows[(0, "gated hidden")].shape == (2, 17, 48)
        assert rows[(0, "MLP hidden norm")].shape == (2, 17, 48)
        assert result.encoder == "EVA, axial RoPE"


@pytest.mark.parametrize("kind", BEITS)
def test_the_beit_walk_measures_the_relative_position_bias(kind):
    torch.manual_seed(0)
    model = Beit(**TINY, **BEITS[kind])
    result, rows, seen = check_walk(model, (2, 3, 32, 32))
    assert rows[(1, "residual")].shape == (2, 17, 24) == seen["blocks.1"]
    bias = rows[(1, "position bias")]
    assert bias.shape == (1, 2, 17, 17) and rows[(1, "bias added")].shape == (2, 2, 17, 17)
    roles = [r.role for r in result.rows if r.block == 0]
    assert roles.index("attention logits") < roles.index("bias added") < roles.index("softmax")
    if kind == "per-block":
        table = model.blocks[1].attn.relative_position_bias_table
        assert bias.params == table.numel() == (7 * 7 + 3) * 2
        assert "position add" not in [r.role for r in result.rows]
        assert bias.detail == "table (52, heads) at offsets"
        gammas = [r.stage for r in result.rows if r.role == "layer scale" and r.block == 0]
        assert gammas == ["blocks.0.gamma_1", "blocks.0.gamma_2"]
    else:
        shared = rows[(None, "shared position bias")]
        assert shared.shape == (2, 17, 17) and shared.params == 52 * 2
        assert (bias.detail, bias.params) == ("the shared bias", 0)
        assert rows[(None, "pooling")].detail == "class token x[:, 0]"


def width(model) -> int:
    return max(len(line) for line in flow(model, (1, 3, 32, 32)).render().splitlines())


@pytest.mark.parametrize(
    "model, vit",
    [
        (dict(eva=EVAS["eva02"]), dict()),
        (dict(eva=EVAS["dinov3"]), dict(reg_tokens=4, global_pool="token")),
        (dict(eva=EVAS["pe"]), dict(class_token=False, global_pool="map")),
        (dict(beit=BEITS["per-block"]), dict()),
        (dict(beit=BEITS["shared"]), dict()),
    ],
    ids=["eva02", "dinov3", "pe", "beit", "beit-shared"],
)
def test_the_tables_are_as_wide_as_a_vits(model, vit):
    """No stage's text widens the table past a ViT's of the same size and prefix tokens."""
    ((family, options),) = model.items()
    model = (Eva if family == "eva" else Beit)(**TINY, **options)
    assert width(model) <= width(VisionTransformer(**TINY, **vit))


@pytest.mark.parametrize(
    "name, line",
    [
        ("eva02_tiny_patch14_224", "blocks.0.attn       rotary positions: RoPE turns the"),
        ("beit_base_patch16_224", "blocks.0.attn       position bias: table (732, heads)"),
    ],
)  # fmt: skip
def test_cli_flow_of_eva_and_beit_names(capsys, name, line):
    """The registered names walk from the command line (narrowed: depth 2)."""
    assert main(["summary", "--flow", name, "--model-opt", "depth=2"]) == 0
    out = capsys.readouterr().out
    assert line in out and "1 more block: each exactly as block 0" in out


def test_cli_flow_refusal_names_the_real_reason(capsys):
    """A family without a stage walk is named as such, not called a timm CNN."""
    argv = ["summary", "--flow", "swinv2_cr_tiny_224", "--model-opt", "depths=[1,1,1,1]"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "vitkit: error: swinv2_cr_tiny_224 is a Swin Transformer V2-cr, which has no stage walk: "
        "--flow and --compare-torch walk the ViT, Swin (V1, V2), EVA and BEiT families\n"
    )


@pytest.mark.parametrize("family", ["eva", "beit"])
def test_the_written_out_attention_is_the_fused_one_and_the_walk_restores_it(family):
    """`fused_attn` False (what the walk sets) writes the attention out with the same outputs;
    the walk sets it back."""
    torch.manual_seed(0)
    model = Eva(**TINY, **EVAS["dinov3"]) if family == "eva" else Beit(**TINY, **BEITS["shared"])
    x = torch.randn(2, 3, 32, 32)
    fused = model.eval()(x)
    flow(model, (2, 3, 32, 32))
    attentions = [block.attn for block in model.blocks]
    assert all(attn.fused_attn is True for attn in attentions)
    for attn in attentions:
        attn.fused_attn = False
    torch.testing.assert_close(model(x), fused, rtol=1e-5, atol=1e-5)


OTHER_EVAS = {
    "gqa": dict(use_rot_pos_emb=True, attn_type="rope", qkv_fused=False, num_kv_heads=(2, 1),
                qk_norm=True, norm_layer="rmsnorm", init_values=1e-5, attn_only_layer_scale=True),
    "mixed": dict(use_rot_pos_emb=True, rope_type="mixed", rope_grid_indexing="xy"),
    "half": dict(use_rot_pos_emb=True, rope_rotate_half=True, num_reg_tokens=2),
    "no-embed-class": dict(no_embed_class=True, num_reg_tokens=1),
    "post-norm": dict(use_post_norm=True, use_rot_pos_emb=True, scale_attn_inner=True),
}  # fmt: skip


@pytest.mark.parametrize("kind", OTHER_EVAS)
def test_the_eva_walk_of_other_options(kind):
    """Grouped key / value heads, RoPE-Mixed, the half rotation, positions on the patches
    only and post-norm blocks: measured as the model runs them."""
    torch.manual_seed(0)
    model = Eva(**TINY, **OTHER_EVAS[kind])
    result, rows, _ = check_walk(model, (2, 3, 32, 32))
    roles = [r.role for r in result.rows]
    if kind == "gqa":  # block 1: one key / value head for both query heads
        assert (0, "kv heads repeated") not in rows
        assert rows[(1, "kv heads repeated")].shape == (2, 2, 17, 12)
        assert rows[(1, "k projection")].shape == (2, 17, 12)
        assert rows[(1, "rotary positions")].shape == (2, 1, 17, 12)  # k's, before repeating
        assert rows[(0, "key norm")].detail == "RMSNorm" and (0, "layer scale") in rows
        assert len([r for r in result.rows if r.role == "layer scale"]) == 2  # attention only
    if kind == "mixed":
        assert rows[(None, "rotary table")].shape == (2, 2, 16, 24)  # (depth, heads, P, 2*hd)
        assert rows[(None, "rotary table")].params == model.rope.freqs.numel()
    if kind == "half":
        assert rows[(0, "rotary positions")].shape == (2, 2, 19, 12)
    if kind == "no-embed-class":
        assert roles.index("position add") < roles.index("token concat")
        assert rows[(None, "position add")].shape == (2, 16, 24)
        assert rows[(None, "token concat")].shape == (2, 18, 24)
    if kind == "post-norm":
        block = [r.role for r in result.rows if r.block == 0]
        assert block.index("attention norm") == block.index("attention projection") + 1
        assert rows[(0, "merged heads norm")].shape == (2, 17, 24)
