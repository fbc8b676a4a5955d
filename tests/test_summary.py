"""vitkit.summary: shapes, parameter totals and FLOPs, checked against references."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

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


torchinfo = pytest.importorskip(
    "torchinfo", reason="torchinfo is not installed (pip install -e '.[test]')"
)


@pytest.mark.parametrize("size", [(1, 3, 32, 32), (2, 3, 24, 40)])
def test_totals_and_shapes_agree_with_torchinfo(size):
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
