"""`vitkit summary --flow` on a Swin: the stages a learner should see, each shape measured in
the model's own forward pass (windows, shifts, clamps and patch merging as the model does them)."""

from vitkit import SwinConfig, SwinTransformer
from vitkit.cli import main
from vitkit.summary import flow

NARROW = dict(embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=10)


def rows_of(result):
    """(stage, role) -> shape; the first of each (a block's rows name their own paths)."""
    out = {}
    for row in result.rows:
        out.setdefault((row.stage, row.role), row.shape)
    return out


def roles(result, prefix):
    return [row.role for row in result.rows if row.stage.startswith(prefix + ".") or
            row.stage == prefix]  # fmt: skip


def test_the_v1_walk_measures_windows_shift_merging_pool_and_head():
    model = SwinTransformer(SwinConfig(img_size=64, **NARROW))  # maps 16x16, then 8x8
    result = flow(model, (2, 3, 64, 64))
    shapes = rows_of(result)
    assert shapes[("patch_embed", "to map")] == (2, 16, 16, 16)
    assert shapes[("layers.0.blocks.0", "window partition")] == (2 * 16, 16, 16)  # 16 windows
    assert shapes[("layers.0.blocks.0.attn", "attention logits")] == (32, 2, 16, 16)
    assert shapes[("layers.0.blocks.0.attn", "position bias")] == (1, 2, 16, 16)
    assert shapes[("layers.0.blocks.0", "window reverse")] == (2, 16, 16, 16)
    assert shapes[("layers.0.blocks.1.attn", "shift mask")] == (2, 16, 2, 16, 16)
    assert shapes[("layers.1.downsample", "patch merging")] == (2, 8, 8, 64)
    assert shapes[("layers.1.downsample.reduction", "merging projection")] == (2, 8, 8, 32)
    assert shapes[("layers.1.blocks.1", "window partition")] == (2 * 4, 16, 32)
    assert shapes[("head", "pooling")] == (2, 32)
    assert shapes[("head.fc", "head")] == (2, 10)
    assert "cyclic shift" not in roles(result, "layers.0.blocks.0")
    shifted = roles(result, "layers.0.blocks.1")
    assert shifted.index("cyclic shift") < shifted.index("window partition")
    assert shifted.index("window reverse") < shifted.index("shift back")
    # every parameter is owned by exactly one stage
    assert sum(r.params or 0 for r in result.rows) == result.total_params
    assert result.total_params == sum(p.numel() for p in model.parameters())
    assert "16x16 grid = 256 patches" in result.render() and "encoder: Swin V1" in result.render()


def test_a_clamped_window_is_one_window_and_not_shifted_as_the_model_does():
    model = SwinTransformer(SwinConfig(img_size=32, **NARROW))  # maps 8x8, then 4x4 = window
    result = flow(model, (1, 3, 32, 32))
    late = roles(result, "layers.1.blocks.1")
    assert "one window" in late and "cyclic shift" not in late and "shift mask" not in late
    assert rows_of(result)[("layers.1.blocks.1", "one window")] == (1, 16, 32)
    always = SwinTransformer(SwinConfig(img_size=32, always_partition=True, **NARROW))
    late = roles(flow(always, (1, 3, 32, 32)), "layers.1.blocks.1")
    assert "cyclic shift" in late and "shift mask" in late and "one window" not in late


def test_padding_to_whole_windows_and_the_crop_are_shown_where_the_model_pads():
    model = SwinTransformer(SwinConfig(img_size=40, **{**NARROW, "window_size": 3}))  # 10x10
    shapes = rows_of(flow(model, (1, 3, 40, 40)))
    assert shapes[("layers.0.blocks.0", "pad")] == (1, 12, 12, 16)
    assert shapes[("layers.0.blocks.0", "window partition")] == (16, 9, 16)
    assert shapes[("layers.0.blocks.0", "crop")] == (1, 10, 10, 16)


def test_the_v2_walk_names_cosine_attention_the_position_mlp_and_post_norms():
    model = SwinTransformer(SwinConfig(img_size=64, version=2, **NARROW))
    result = flow(model, (1, 3, 64, 64))
    by_role = {(r.stage, r.role): r for r in result.rows}
    logits = by_role[("layers.0.blocks.0.attn", "attention logits")]
    assert logits.detail.startswith("cos(q, k)") and logits.shape == (16, 2, 16, 16)
    bias = by_role[("layers.0.blocks.0.attn", "position bias")]
    cpb = model.layers[0].blocks[0].attn.cpb_mlp
    assert "cpb_mlp" in bias.detail and bias.params == sum(p.numel() for p in cpb.parameters())
    block = roles(result, "layers.0.blocks.0")
    assert block.index("attention norm") > block.index("window reverse")  # res-post-norm
    merging = roles(result, "layers.1.downsample")
    assert merging == ["patch merging", "merging projection", "merging norm"]
    assert sum(r.params or 0 for r in result.rows) == result.total_params
    assert "encoder: Swin V2" in result.render()
    plain = flow(SwinTransformer(SwinConfig(img_size=32, version=2, qkv_bias=False, **NARROW)),
                 (1, 3, 32, 32))  # fmt: skip
    qkv = next(r for r in plain.rows if r.role == "qkv projection")
    assert qkv.detail == "Linear 16->48" and qkv.params == 16 * 48


def test_blocks_that_repeat_an_earlier_block_fold_into_one_line_each():
    model = SwinTransformer(SwinConfig(img_size=64, **NARROW))
    result = flow(model, (1, 3, 64, 64))
    text = result.render()
    assert "each stage as in layers.0.blocks.0" in text
    assert "each stage as in layers.0.blocks.1" in text
    folded = [r for r in result.shown_rows() if r.role == "block"]
    assert [r.stage for r in folded] == ["layers.1.blocks.0", "layers.1.blocks.1"]
    stage1 = model.layers[1].blocks
    assert [r.params for r in folded] == [sum(p.numel() for p in b.parameters()) for b in stage1]
    assert [r.shape for r in folded] == [(1, 8, 8, 32)] * 2
    full = result.render(all_blocks=True)
    assert "each stage as in" not in full and "layers.1.blocks.1.attn.qkv" in full


def test_s3_windows_per_stage_are_measured():
    model = SwinTransformer(SwinConfig(img_size=64, **{**NARROW, "window_size": (8, 2)}))
    shapes = rows_of(flow(model, (1, 3, 64, 64)))
    assert shapes[("layers.0.blocks.0", "window partition")] == (4, 64, 16)  # 8x8 windows
    assert shapes[("layers.1.blocks.0", "window partition")] == (16, 4, 32)  # 2x2 windows


def test_cli_flow_of_a_swin_name_and_compare_torch_refused(capsys):
    options = ["embed_dim=16", "depths=[1, 1]", "num_heads=[1, 2]", "window_size=4"]
    argv = ["summary", "--flow", "swin_tiny_patch4_window7_224", "--img-size", "32"]
    argv += [item for option in options for item in ("--model-opt", option)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "layers.0.blocks.0              window partition" in out
    assert "(4, 16, 16)" in out and "encoder: Swin V1" in out
    assert main([*argv, "--compare-torch"]) != 0
    assert "--compare-torch compares ViT encoders" in capsys.readouterr().err


def test_a_registered_v2_model_walks_to_its_head():
    from vitkit import create_model

    model = create_model("swinv2_tiny_window8_256", img_size=64, depths=(1, 1, 1, 1), embed_dim=24)
    result = flow(model, (1, 3, 64, 64))
    assert result.rows[-1].shape == (1, 1000)
    assert sum(r.params or 0 for r in result.rows) == result.total_params


def test_cli_flow_of_a_swin_checkpoint(tmp_path, capsys):
    import vitkit

    model = SwinTransformer(SwinConfig(img_size=32, in_chans=1, **NARROW))
    vitkit.save(model, tmp_path / "swin.safetensors")
    assert main(["summary", "--flow", str(tmp_path / "swin.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "Input: (1, 1, 32, 32); 8x8 grid = 64 patches" in out
    assert "layers.1.blocks.0              one window" in out  # the 4x4 map is its window
    assert "layers.1.blocks.1              block: each stage as in layers.1.blocks.0" in out
    total = sum(p.numel() for p in model.parameters())
    assert f"Total params: {total:,}" in out


def test_the_legend_explains_every_layout_symbol_and_is_wrapped():
    """Every symbol the layouts use is in the legend (Hp / Wp and hidden were not), and the
    legend is wrapped to 100 columns."""
    text = flow(SwinTransformer(SwinConfig(img_size=64, **NARROW)), (1, 3, 64, 64)).render()
    legend = text.split("\nLayout: ", 1)[1].rsplit("\n", 1)[0]
    assert max(len(line) for line in ("Layout: " + legend).splitlines()) <= 100
    legend = " ".join(legend.split())
    for symbol in ("Hp x Wp the map padded to whole windows", "hidden the MLP's width", "nW"):
        assert symbol in legend
