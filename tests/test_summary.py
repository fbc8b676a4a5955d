"""vitkit.summary: shapes, parameter totals and FLOPs, checked against references."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from _helpers import requires_torchinfo
from vitkit import VisionTransformer, create_model, summary
from vitkit.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_totals_and_rows_for_vit_digits():
    model = create_model("vit_digits")
    result = summary(model, (1, 8, 8))
    assert result.total_params == result.trainable_params == 136_138
    rows = {row.name: row for row in result.rows}
    assert rows["patch_embed"].output_shape == (1, 16, 64)
    assert rows["patch_embed.proj"].output_shape == (1, 64, 4, 4)
    assert rows["blocks"].output_shape == (1, 17, 64)
    assert rows["head"].output_shape == (1, 10)
    assert rows["head"].params == 650
    assert rows["VisionTransformer"].params == 136_138


def analytic_flops(
    d: int, depth: int, tokens: int, patches: int, patch_dim: int, classes: int
) -> int:
    """2 x multiply-adds of every matrix product in a ViT forward pass."""
    embed = 2 * patches * patch_dim * d
    qkv_proj_mlp = 2 * tokens * (3 * d * d + d * d + 8 * d * d)
    attention = 2 * 2 * tokens * tokens * d  # q k^T and (weights) v
    return embed + depth * (qkv_proj_mlp + attention) + 2 * d * classes


def test_flops_equal_the_analytic_count_and_flop_counter():
    model = VisionTransformer(
        img_size=(24, 40), patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3
    )
    result = summary(model, (2, 3, 24, 40))
    expected = 2 * analytic_flops(32, 2, tokens=16, patches=15, patch_dim=3 * 64, classes=3)
    assert result.total_flops == expected
    for block in model.blocks:  # the explicit attention path is plain matrix products
        block.attn.fused_attn = False
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(2, 3, 24, 40))
    assert result.total_flops == counter.get_total_flops()
    assert str(result).splitlines()[-2].startswith("Total FLOPs:")


def test_summary_of_the_torch_backend_counts_the_same_flops():
    native = summary(
        VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4),
        (1, 3, 16, 16),
    )
    backend = summary(
        VisionTransformer(
            img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, encoder="torch"
        ),
        (1, 3, 16, 16),
    )
    assert backend.total_flops == native.total_flops
    assert backend.total_params == native.total_params


def test_training_flag_is_restored():
    model = create_model("vit_digits").train()
    summary(model, (1, 8, 8))
    assert model.training


@requires_torchinfo
@pytest.mark.parametrize("size", [(1, 3, 32, 32), (2, 3, 24, 40)])
def test_totals_and_shapes_agree_with_torchinfo(size):
    import torchinfo

    model = VisionTransformer(
        img_size=size[2:], patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3
    )
    ours = summary(model, size)
    theirs = torchinfo.summary(model, input_size=size, verbose=0, depth=10)
    assert ours.total_params == theirs.total_params
    assert ours.trainable_params == theirs.trainable_params

    def full_name(info):
        parts = []
        while info is not None and info.depth > 0:
            parts.append(info.var_name)
            info = info.parent_info
        return ".".join(reversed(parts))

    their_shapes = {full_name(info): tuple(info.output_size) for info in theirs.summary_list}
    ours_full = summary(model, size, max_depth=10)
    compared = 0
    for row in ours_full.rows[1:]:
        if row.name in their_shapes:
            assert row.output_shape == their_shapes[row.name], row.name
            compared += 1
    assert compared >= 20


def test_cli_summary_prints_the_table(capsys):
    assert main(["summary", "vit_tiny_patch16_224", "--img-size", "224", "320"]) == 0
    out = capsys.readouterr().out
    assert "Input size: 1x3x224x320" in out
    extra_positions = (14 * 20 + 1) - (14 * 14 + 1)  # ViT-Ti/16 at 224x320 vs 224x224
    assert f"Total params: {5_717_416 + extra_positions * 192:,}" in out
    assert "1x281x192" in out


def test_python_dash_m_summary_and_unknown_name():
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    ok = subprocess.run(
        [sys.executable, "-m", "vitkit", "summary", "vit_digits"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ok.returncode == 0 and "Total params: 136,138" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "vitkit", "summary", "vit_tiny"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith(
        "vitkit: error: unknown model name 'vit_tiny'; did you mean"
    )
    assert "Traceback" not in bad.stderr


def test_flop_counter_counts_cpu_attention_backward():
    """Forward + backward: the fused CPU kernel's backward counts the explicit path's four
    products plus the recomputed q k^T (flash attention recomputes it), per block."""
    from vitkit.summary import flop_counter

    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4)
    x = torch.randn(2, 3, 16, 16)
    totals = []
    for fused in (True, False):
        for block in model.blocks:
            block.attn.fused_attn = fused
        with flop_counter() as counter:
            model(x).sum().backward()
        totals.append(counter.get_total_flops())
    tokens, batch, depth = 17, 2, 2
    recompute = 2 * batch * tokens * tokens * 32  # q k^T over all heads
    assert totals[0] == totals[1] + depth * recompute


# -- the stage-by-stage walk (--flow) ---------------------------------------------------------


def flow_table(text: str) -> list[list[str]]:
    """The rows of a printed flow (or comparison) table, split into their columns."""
    rules = [i for i, line in enumerate(text.splitlines()) if line and set(line) == {"-"}]
    lines = text.splitlines()[rules[1] + 1 : rules[2]]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_cli_flow_walks_the_32px_patch8_example(capsys):
    argv = ["summary", "vit_tiny_patch16_224", "--img-size", "32", "--model-opt", "patch_size=8"]
    argv.append("--flow")
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {(r[0], r[1].split(":")[0]): r for r in flow_table(out)}
    expected = {
        ("input", "image"): "(1, 3, 32, 32)",
        ("patch_embed.proj", "patch embedding"): "(1, 192, 4, 4)",
        ("= unfold", "same as"): "(1, 192, 16)",
        ("= linear", "then"): "(1, 16, 192)",
        ("patch_embed", "flatten"): "(1, 16, 192)",
        ("cls_token", "token concat"): "(1, 17, 192)",
        ("pos_embed", "position add"): "(1, 17, 192)",
        ("blocks.0.attn.qkv", "qkv projection"): "(1, 17, 576)",
        ("blocks.0.attn", "split heads"): "(3, 1, 3, 17, 64)",
        ("blocks.0.attn", "attention logits"): "(1, 3, 17, 17)",
        ("blocks.0.attn", "softmax"): "(1, 3, 17, 17)",
        ("blocks.0.attn", "weighted values"): "(1, 3, 17, 64)",
        ("blocks.0.attn", "merge heads"): "(1, 17, 192)",
        ("blocks.0.mlp.fc1", "MLP hidden"): "(1, 17, 768)",
        ("pool", "pooling"): "(1, 192)",
        ("head", "head"): "(1, 1000)",
    }
    for key, shape in expected.items():
        assert rows[key][3] == shape, key
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8)
    total = sum(p.numel() for p in model.parameters())
    assert f"Total params: {total:,} " in out
    assert "4x4 grid = 16 patches, 17 tokens" in out
    shown = sum(int(r[4].replace(",", "")) for r in flow_table(out) if r[4] != "-")
    assert shown == total  # every parameter belongs to exactly one stage


WALKS = [
    dict(img_size=(60, 100), patch_size=20),
    dict(img_size=32, patch_size=8, global_pool="avg", class_token=False, pos_embed="sincos2d"),
    dict(img_size=32, patch_size=8, distilled=True, init_values=1e-5, mlp_ratio=2.5),
    dict(img_size=32, patch_size=2, conv_stem=(8, 16), patch_embed="unfold", embed_norm=True),
    dict(img_size=32, patch_size=8, dynamic_img_size=True, pos_embed="none", fc_norm=True),
]


def _hooked_shapes(model, x, names):
    shapes = {}

    def record(name, output):
        shapes.setdefault(name, tuple((output[0] if isinstance(output, tuple) else output).shape))

    hooks = [
        model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: record(name, o))
        for name in names
    ]
    with torch.no_grad():
        logits = model(x)
        for hook in hooks:
            hook.remove()
        _, maps = model(x, return_attention=True)
    return logits, maps, shapes


@pytest.mark.parametrize("options", WALKS, ids=lambda o: ",".join(map(str, o.values())))
def test_flow_shapes_are_the_models_own(options):
    """Each stage's shape equals what the model itself produces: its attention maps, its
    sub-layers' outputs (hooks) and its features; parameters add up to the model's."""
    from vitkit.summary import flow

    torch.manual_seed(0)
    model = VisionTransformer(embed_dim=24, depth=2, num_heads=3, num_classes=5, **options)
    size = (
        (2, 3, 48, 40) if options.get("dynamic_img_size") else (2, 3, *model.patch_embed.img_size)
    )
    x = torch.zeros(size)
    result = flow(model, size)
    names = ["patch_embed", "blocks.1.attn.qkv", "blocks.1.mlp.fc1", "blocks.1"]
    logits, maps, hooked = _hooked_shapes(model, x, names)
    rows = {(r.stage, r.role): r.shape for r in result.rows}
    tokens = maps[0].shape[-1]
    assert result.tokens == tokens and result.patches == hooked["patch_embed"][1]
    assert rows[("blocks.1.attn", "attention logits")] == tuple(maps[1].shape)
    assert rows[("blocks.1.attn", "softmax")] == tuple(maps[1].shape)
    assert rows[("blocks.1.attn", "split heads")] == (3, 2, 3, tokens, 8)
    assert rows[("blocks.1.attn.qkv", "qkv projection")] == hooked["blocks.1.attn.qkv"]
    assert rows[("blocks.1.mlp.fc1", "MLP hidden")] == hooked["blocks.1.mlp.fc1"]
    assert rows[("blocks.1", "residual")] == hooked["blocks.1"]
    assert result.rows[-1].shape == tuple(logits.shape)
    assert sum(r.params or 0 for r in result.rows) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("batch", [1, 2])
def test_flow_of_the_torch_encoder_matches_the_native_one(batch):
    """nn.MultiheadAttention works sequence-first and folds the heads into the batch: its
    logits are the native (B, heads, N, N) with B and heads merged; the rest is the same."""
    from vitkit.summary import compare_params, flow

    shape = dict(img_size=(60, 100), patch_size=20, embed_dim=24, depth=2, num_heads=3)
    size = (batch, 3, 60, 100)
    native = flow(VisionTransformer(**shape), size)
    other = flow(VisionTransformer(**shape, encoder="torch"), size)
    ours = {(r.block, r.role): r for r in native.rows}
    theirs = {(r.block, r.role): r for r in other.rows}
    b, heads, n, _ = ours[(1, "attention logits")].shape
    assert theirs[(1, "attention logits")].shape == (b * heads, n, n)
    assert theirs[(1, "split heads")].shape == (b * heads, n, 8)
    assert theirs[(1, "split q, k, v")].shape == (3, n, b, 24)
    for key in [(None, "token concat"), (1, "MLP hidden"), (1, "residual"), (None, "head")]:
        assert theirs[key].shape == ours[key].shape, key
    for key in [(1, "qkv projection"), (1, "attention projection"), (1, "MLP output")]:
        assert theirs[key].params == ours[key].params > 0, key
    table = flow_table(compare_params(native, other))
    assert table[-1] == ["total", f"{native.total_params:,}", f"{other.total_params:,}"]
    assert all(row[2] == row[4] for row in table[:-1])


def test_cli_compare_torch(capsys):
    argv = ["summary", "vit_digits", "--model-opt", "depth=3", "--compare-torch"]
    assert main(argv) == 0
    rows = flow_table(capsys.readouterr().out)
    named = {row[0]: row for row in rows}
    assert named["block 0: qkv projection"][1:] == [
        "blocks.0.attn.qkv",
        f"{64 * 192 + 192:,}",
        "blocks.layers.0.self_attn.in_proj",
        f"{64 * 192 + 192:,}",
    ]
    total = sum(p.numel() for p in create_model("vit_digits", depth=3).parameters())
    assert named["total"] == ["total", f"{total:,}", f"{total:,}"]
    assert named["blocks 1-2"][2] == named["blocks 1-2"][4]


def test_flow_folds_only_blocks_that_repeat_block_0():
    from vitkit.model.layers import Block
    from vitkit.summary import flow

    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=3, num_heads=3)
    folded = flow(model, (1, 3, 16, 16))
    per_block = len(folded.blocks()[0])
    assert len(folded.render(all_blocks=True).splitlines()) == (
        len(folded.render().splitlines()) + 2 * per_block - 1
    )
    assert "blocks.1-2          2 more blocks: each exactly as block 0" in folded.render()
    model.blocks[2] = Block(24, num_heads=4 // 4 * 6, mlp_ratio=2.0)  # 6 heads, narrower MLP
    mixed = flow(model, (1, 3, 16, 16))
    assert not mixed.blocks_alike() and "more blocks" not in mixed.render()
    rows = {(r.block, r.role): r.shape for r in mixed.rows}
    assert rows[(2, "attention logits")] == (1, 6, 17, 17)
    assert rows[(2, "MLP hidden")] == (1, 17, 48)


def test_flow_restores_the_fast_path_attention_kernel_and_mode():
    from vitkit.summary import flow

    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=192, depth=2, num_heads=3)
    model.train()
    classes = [type(m) for m in model.modules()]
    x = torch.randn(1, 3, 16, 16)
    before = model.eval()(x).detach()
    model.train()
    flow(model, (1, 3, 16, 16))
    assert model.training
    assert [type(m) for m in model.modules()] == classes
    assert all(block.attn.fused_attn for block in model.blocks)
    torch.testing.assert_close(model.eval()(x), before, rtol=0, atol=0)


def test_flow_errors():
    from vitkit.summary import flow

    with pytest.raises(
        TypeError, match=r"describes its stages \(a vitkit VisionTransformer\), not Linear"
    ):
        flow(torch.nn.Linear(2, 2), (1, 2))


def test_cli_summary_options_are_trains(capsys):
    options = ["--model-opt", "global_pool=avg", "--model-opt", "pos_embed=sincos2d"]
    argv = ["summary", "vit_digits", *options, "--img-size", "12", "16", "--batch-size", "3"]
    argv.append("--flow")
    assert main(argv) == 0
    rows = {r[1].split(":")[0]: r for r in flow_table(capsys.readouterr().out)}
    assert rows["image"][3] == "(3, 1, 12, 16)"
    assert rows["pooling"][1] == "pooling: mean of the patch tokens"
    assert rows["position add"][1:] == [
        "position add: x + fixed sincos2d table (not trained) (1, N, D)", "(B, N, D)",
        "(3, 49, 64)", "0",
    ]  # fmt: skip
    code = main(["summary", "vit_digits", "--img-size", "16", "--model-opt", "img_size=12"])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        "vitkit: error: --img-size and --model-opt img_size=... both set img_size; give it once\n"
    )
    assert main(["summary", "vit_digits", "--img-size", "0"]) == 2
    assert "img_size" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, stage, detail, shape",
    [
        (dict(), "pool", "class token x[:, 0]", (2, 24)),
        (dict(global_pool="avg"), "pool", "mean of the patch tokens", (2, 24)),
        (dict(global_pool="max"), "pool", "max of the patch tokens", (2, 24)),
        (dict(global_pool="avgmax", reg_tokens=2, pool_include_prefix=True), "pool",
         "(mean + max) / 2 of all tokens", (2, 24)),
        (dict(global_pool="map"), "attn_pool",
         "attention pool (attn_pool): a learned query attends over the patch tokens", (2, 24)),
        (dict(global_pool="none", class_token=False, num_classes=0), "pool",
         "none: every token goes on", (2, 4, 24)),
    ],
)  # fmt: skip
def test_the_flow_names_the_models_own_pooling(options, stage, detail, shape):
    from vitkit.summary import flow

    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=1, num_heads=3,
                              **{"num_classes": 5, **options})  # fmt: skip
    result = flow(model, (2, 3, 16, 16))
    (pool,) = [r for r in result.rows if r.role == "pooling"]
    assert (pool.stage, pool.detail, pool.shape) == (stage, detail, shape)
    assert sum(r.params or 0 for r in result.rows) == sum(p.numel() for p in model.parameters())


def test_cli_summary_takes_the_models_own_options(capsys):
    """The model's options go through --model-opt, checked by its family's schema as in
    `vitkit train` (the table's depth is --max-depth)."""
    argv = ["summary", "vit_digits", "--model-opt", "depth=2", "--model-opt", "num_classes=3"]
    argv += ["--max-depth", "1", "--model-opt", "class_token=false"]
    assert main([*argv, "--model-opt", "global_pool=avg"]) == 0
    out = capsys.readouterr().out
    expected = create_model("vit_digits", depth=2, num_classes=3, class_token=False,
                            global_pool="avg")  # fmt: skip
    assert f"Total params: {sum(p.numel() for p in expected.parameters()):,}" in out
    assert "head (Linear)" in out and "blocks.0" not in out  # one level deep
    assert main(["summary", "vit_digits", "--model-opt", "depth=x"]) == 2
    assert capsys.readouterr().err == 'vitkit: error: depth must be an integer, got "x" (str)\n'


@pytest.mark.parametrize(
    "options",
    [
        dict(mlp_layer="swiglu", act_layer="silu"),
        dict(mlp_layer="swiglu_packed", act_layer="silu", scale_mlp_norm=True),
        dict(qk_norm=True, scale_attn_norm=True, norm_layer="rmsnorm"),
        dict(res_post_norm=True, pre_norm=True, act_layer="quick_gelu"),
    ],
    ids=["swiglu", "swiglu-packed", "qk-norm", "res-post-norm"],
)
def test_the_flow_of_other_blocks_is_measured_and_owns_every_parameter(options):
    """Each layer describes its own stages: gated MLPs, q/k norms, post-norm blocks and the
    pre-norm of CLIP (the walk used to know the paper's MLP only)."""
    from vitkit.summary import flow

    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=2, num_heads=3,
                              mlp_ratio=2.0, **options)  # fmt: skip
    result = flow(model, (2, 3, 16, 16))
    _, _, hooked = _hooked_shapes(model, torch.zeros(2, 3, 16, 16), ["blocks.1.mlp.fc2"])
    rows = {(r.block, r.role): r for r in result.rows}
    assert rows[(1, "MLP output")].shape == hooked["blocks.1.mlp.fc2"] == (2, 5, 24)
    assert sum(r.params or 0 for r in result.rows) == sum(p.numel() for p in model.parameters())
    roles = [r.role for r in result.rows if r.block == 0]
    if "swiglu" in options.get("mlp_layer", ""):
        assert rows[(0, "gated hidden")].shape == (2, 5, 48 if options["mlp_layer"] == "swiglu"
                                                   else 24)  # fmt: skip
    if options.get("qk_norm"):
        assert rows[(0, "query norm")].shape == rows[(0, "key norm")].shape == (2, 3, 5, 8)
        assert rows[(0, "attention norm")].detail == "RMSNorm"
    if options.get("res_post_norm"):  # the norm follows each branch
        assert roles.index("attention norm") == roles.index("attention projection") + 1
        first_block = next(i for i, r in enumerate(result.rows) if r.block == 0)
        assert result.rows[first_block - 1].role == "norm before the blocks"


def test_any_model_that_describes_its_stages_is_walked():
    """summary.flow knows no ViT attribute: a model naming its own stages is measured."""
    from torch import nn

    from vitkit.model.stages import FlowSpec, Input, Op, Output, Stage
    from vitkit.summary import flow

    class Toy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 4, stride=4)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            x = self.stem(x).flatten(2).transpose(1, 2)  # (B, P, 8)
            return self.head(x.mean(1))

        def describe_flow(self, input_size):
            stages = (
                Stage("input", "image", "", "(B, C, H, W)", Input("")),
                Stage("stem", "patches", "Conv2d 3->8", "(B, 8, h, w)", Output("stem"), 392),
                Stage("", "tokens", "flatten + transpose", "(B, P, 8)", Op("", ("transpose",))),
                Stage("head", "head", "Linear 8->2", "(B, 2)", Output("head"), 18),
            )
            grid = (input_size[2] // 4, input_size[3] // 4)
            return FlowSpec(stages, "toy", "", grid, Output("stem"), Op("", ("transpose",)), "toy")

    result = flow(Toy(), (2, 3, 8, 12))
    assert [r.shape for r in result.rows] == [(2, 3, 8, 12), (2, 8, 2, 3), (2, 6, 8), (2, 2)]
    assert (result.grid, result.patches, result.tokens) == ((2, 3), 8, 6)
    assert "2x3 grid = 8 patches, 6 tokens; encoder: toy" in result.render()
