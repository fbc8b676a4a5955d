"""A Swin on the ViT's paths, against timm: features_only backbones, set_input_size, layer
decay, freezing and linear probing (timm's stage / block numbering).

Models are narrowed (width 32, two blocks per stage) and perturbed as in test_swin.py; outputs
must equal timm's within 1e-5 relative."""

from __future__ import annotations

import re

import pytest
import torch

from _helpers import optional_import, perturb, relative_error, requires_timm
from vitkit import SwinBackbone, create_model
from vitkit.train.optim import freeze_layers, layer_ids, param_groups
from vitkit.train.tasks import ClassificationTask

timm = optional_import("timm")
RTOL = 1e-5
NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))
V1 = "swin_tiny_patch4_window7_224"
V2 = "swinv2_tiny_window8_256"


def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return relative_error(ours, theirs) < RTOL


def pair(name: str, **options):
    torch.manual_seed(0)
    source = perturb(timm.create_model(name, pretrained=False, **NARROW, **options))
    model = create_model(name, **NARROW, **options)
    model.load_state_dict(source.state_dict(), strict=True)
    return source, model.eval()


@requires_timm
@pytest.mark.parametrize("out_indices", [(0, 2)])  # pruned after stage 2
def test_features_only_equals_timms(out_indices):
    """timm's FeatureListNet returns each stage's map NHWC; vitkit's NCHW by default (the
    layout of the ViT's and every CNN's maps), timm's with output_fmt='NHWC'."""
    source, _ = pair(V1, img_size=64)
    picked = {} if out_indices is None else {"out_indices": out_indices}
    theirs = timm.create_model(V1, features_only=True, **NARROW, img_size=64, **picked).eval()
    theirs.load_state_dict(source.state_dict(), strict=False)  # its layers_N names
    for key, value in theirs.state_dict().items():
        value.copy_(source.state_dict()[key.replace("layers_", "layers.")])
    ours = create_model(V1, features_only=True, **NARROW, img_size=64, **picked)
    ours.model.load_state_dict(source.state_dict(), strict=False)
    assert isinstance(ours, SwinBackbone) and ours.out_indices == list(
        theirs.feature_info.out_indices
    )
    for key in ("num_chs", "reduction", "module"):
        assert ours.feature_info.get(key) == theirs.feature_info.get(key)
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    assert len(ours.model.layers) == max(ours.out_indices) + 1  # pruned as timm's
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    nhwc = create_model(V1, features_only=True, output_fmt="NHWC", **NARROW, img_size=64, **picked)
    nhwc.model.load_state_dict(ours.model.state_dict())
    with torch.no_grad():
        maps, their_maps, ours_nhwc = ours.eval()(x), theirs(x), nhwc.eval()(x)
    for got, nhwc_map, want in zip(maps, ours_nhwc, their_maps, strict=True):
        assert close(got, want.permute(0, 3, 1, 2)) and close(nhwc_map, want)


def test_backbone_of_a_loaded_model_and_errors():
    torch.manual_seed(0)
    model = create_model(V2, **NARROW, img_size=64).eval()
    backbone = SwinBackbone(model, out_indices=1, norm=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        (last,) = backbone(x)
        torch.testing.assert_close(last, model.forward_features(x).permute(0, 3, 1, 2))
    assert backbone.channels == [256] and backbone.reductions == [32]
    assert SwinBackbone(model).out_indices == [0, 1, 2, 3]  # every stage, timm's default
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NHWC', got 'NLC'"):
        SwinBackbone(model, output_fmt="NLC")
    with pytest.raises(ValueError, match="out_indices, feature_cls and output_fmt describe"):
        create_model(V1, out_indices=(1, 2))


@requires_timm
@pytest.mark.parametrize(
    "name, start, change",
    [
        (V1, 64, dict(img_size=(96, 64), window_size=(6, 6, 4, 2))),  # per stage, tables resized
        (V2, 64, dict(img_size=128)),  # windows scale with the grid: 8 -> 16, clamps lifted
    ],
)
def test_set_input_size_equals_timms(name, start, change):
    source, model = pair(name, img_size=start)
    source.set_input_size(**change)
    model.set_input_size(**change)
    assert [b.window_size for s in model.layers for b in s.blocks] == [
        tuple(b.window_size) for s in source.layers for b in s.blocks
    ]
    x = torch.randn(2, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert close(model(x), source(x))
    rebuilt = type(model)(model.config)  # the config records the new geometry
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), model(x))


def test_set_input_size_refuses_windows_of_another_shape():
    model = create_model(V1, **NARROW, img_size=64)
    with pytest.raises(ValueError, match=r"scales the 7-wide windows to \[7, 10\] per side"):
        model.set_input_size(img_size=(64, 96))
    with pytest.raises(ValueError, match="give one side for every stage or one per stage"):
        model.set_input_size(window_size=(4, 6))


@requires_timm
@pytest.mark.parametrize("name", [V1, V2])
def test_layer_decay_groups_equal_timms(name):
    """Every parameter's layer, lr scale and weight decay are those of timm's
    param_groups_layer_decay(layer_decay=0.75) on the same model (10 layers: the stem, 8
    blocks with each stage's patch merging joined to its first, the head)."""
    from timm.optim import param_groups_layer_decay

    source, model = pair(name, img_size=64)
    reference = param_groups_layer_decay(
        source, 0.05, no_weight_decay_list=source.no_weight_decay(), layer_decay=0.75
    )
    names = {id(p): n for n, p in source.named_parameters()}
    want = {
        names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in reference for p in g["params"]
    }
    ours = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, 0.05, 0.75)
    got = {ours[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert got == want
    ids = layer_ids(model)
    assert ids["patch_embed.proj.weight"] == 0 and ids["head.fc.weight"] == 9
    assert (
        ids["layers.1.downsample.reduction.weight"] == ids["layers.1.blocks.0.mlp.fc1.weight"] == 3
    )
    assert ids["norm.weight"] == ids["layers.3.blocks.1.attn.proj.weight"] == 8


def test_freeze_and_linear_probe_follow_the_stage_numbering():
    model = create_model(V1, **NARROW, img_size=64, num_classes=10)
    assert freeze_layers(model, blocks=3) > 0
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    part = re.compile(r"patch_embed\.\w+|layers\.\d+\.(?:downsample|blocks\.\d+)")
    stages = {part.match(n).group(0) for n in frozen}
    assert stages == {"patch_embed.proj", "patch_embed.norm", "layers.0.blocks.0",
                      "layers.0.blocks.1", "layers.1.downsample", "layers.1.blocks.0"}  # fmt: skip
    assert "patch_embed.proj.weight" in frozen and "layers.1.blocks.1.attn.qkv.weight" not in frozen
    with pytest.raises(ValueError, match="freeze 9 is more than the model's 8 blocks"):
        freeze_layers(create_model(V1, **NARROW, img_size=64), blocks=9)
    probe = create_model(V1, **NARROW, img_size=64, num_classes=10)
    freeze_layers(probe, linear_probe=True)
    assert [n for n, p in probe.named_parameters() if p.requires_grad] == [
        "head.fc.weight",
        "head.fc.bias",
    ]


def test_fused_window_attention_equals_the_written_out_path():
    """Version 1's one SDPA call over the windows (bias + shift mask as its mask) against the
    written-out softmax that version 2 keeps (and timm's explicit path, in test_swin.py)."""
    torch.manual_seed(0)
    model = perturb(create_model(V1, **NARROW, img_size=64))
    x = torch.randn(2, 3, 64, 64)
    assert all(b.attn.fused_attn for s in model.layers for b in s.blocks)
    with torch.no_grad():
        fused = model(x)
        for stage in model.layers:
            for block in stage.blocks:
                block.attn.fused_attn = False
        assert close(fused, model(x))


@pytest.mark.parametrize("options", [dict(layer_decay=0.75, freeze=3), dict(linear_probe=True)])
def test_a_training_step_on_a_swin_keeps_the_frozen_layers(options):
    """The train loop's own state (`new_run_state`, `train_one_epoch`) on a Swin: frozen
    parameters are out of the optimiser and unchanged, the others move, each group at its
    layer's scale."""
    from vitkit.train import TrainConfig
    from vitkit.train.fit import new_run_state
    from vitkit.train.loop import train_one_epoch

    torch.manual_seed(0)
    model = create_model(V1, **NARROW, img_size=64, window_size=4, num_classes=4, in_chans=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(epochs=1, batch_size=4, lr=1e-2, warmup_epochs=0, mixup=0.0,
                         cutmix=0.0, **options)  # fmt: skip
    state = new_run_state(ClassificationTask(model, config), config, batches_per_epoch=1)
    train_one_epoch(state, [(torch.randn(4, 1, 64, 64), torch.arange(4))])
    trained = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    for name, param in model.named_parameters():
        moved = not torch.equal(param, before[name])
        assert (id(param) in trained) == param.requires_grad == moved, name
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    if options.get("linear_probe"):
        assert {n for n, _ in model.named_parameters()} - frozen == {
            "head.fc.weight",
            "head.fc.bias",
        }
    else:
        assert "layers.1.blocks.0.attn.qkv.weight" in frozen
        assert "layers.1.blocks.1.attn.qkv.weight" not in frozen
        scales = sorted({g["lr_scale"] for g in state.optimizer.param_groups})
        assert scales == [0.75**k for k in range(5, -1, -1)]  # layers 4 to 9 (the head) train
