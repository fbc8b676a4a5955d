"""Fine-tuning options: layer-wise lr decay (parity with timm), freezing, linear probing,
gradient checkpointing, and the finetune recipe."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _helpers import digits_subsets, requires_timm
from vitkit import cli, create_model, load, save
from vitkit.train import LAST_FILE, RECIPES, StopFlag, TrainConfig, fit, param_groups
from vitkit.train.fit import new_run_state
from vitkit.train.loop import train_one_epoch
from vitkit.train.optim import freeze_layers, layer_ids
from vitkit.train.tasks import ClassificationTask

try:  # the parity tests with timm are marked requires_timm
    import timm
    from timm.optim import param_groups_layer_decay
except ModuleNotFoundError:
    timm = param_groups_layer_decay = None

TINY = dict(img_size=8, patch_size=2, in_chans=1, embed_dim=16, num_heads=2, num_classes=10)


def tiny_model(depth=3, **kw):
    torch.manual_seed(0)
    return create_model("vit_digits", **{**TINY, "depth": depth, **kw})


@pytest.fixture(scope="module")
def digits():
    return digits_subsets(96, 32)


def cfg(**kw):
    base = dict(epochs=1, batch_size=32, lr=2e-3, warmup_epochs=0, mixup=0.0, cutmix=0.0)
    return TrainConfig(**{**base, **kw})


def named_groups(model, groups):
    """{parameter name: (lr_scale, weight_decay)} of a list of optimiser groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: (g.get("lr_scale", 1.0), g["weight_decay"])
        for g in groups
        for p in g["params"]
    }


LAYOUTS = {
    "class token, final norm": {},
    "average pool, fc_norm": {"global_pool": "avg", "fc_norm": True},
    "no class token": {"class_token": False, "global_pool": "avg"},
}


@requires_timm
@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("decay", [0.65, 0.9])
def test_layer_decay_groups_equal_timms(layout, decay):
    """Every parameter gets the lr scale and weight decay timm's `param_groups_layer_decay`
    gives the same layout under the same names."""
    options = LAYOUTS[layout]
    ours = tiny_model(depth=4, **options)
    theirs = timm.models.VisionTransformer(**{**TINY, "depth": 4, **options})
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    reference = param_groups_layer_decay(
        theirs, 0.05, no_weight_decay_list=theirs.no_weight_decay(), layer_decay=decay
    )
    got = named_groups(ours, param_groups(ours, 0.05, decay))
    assert got == named_groups(theirs, reference)
    assert got["head.weight"] == (1.0, 0.05) and got["patch_embed.proj.weight"][0] == decay**5


@requires_timm
def test_layer_decay_of_a_distilled_model_equals_timms_deit():
    ours = tiny_model(depth=2, distilled=True)
    theirs = timm.models.deit.VisionTransformerDistilled(**{**TINY, "depth": 2})
    assert {n for n, _ in ours.named_parameters()} == {n for n, _ in theirs.named_parameters()}
    reference = param_groups_layer_decay(
        theirs, 0.05, no_weight_decay_list=theirs.no_weight_decay(), layer_decay=0.5
    )
    got = named_groups(ours, param_groups(ours, 0.05, 0.5))
    assert got == named_groups(theirs, reference)
    assert got["dist_token"] == (0.125, 0.0) and got["head_dist.weight"] == (1.0, 0.05)


def test_layer_ids_of_the_torch_encoder_follow_the_native_blocks():
    native = tiny_model(depth=3, drop_path_rate=0.0)
    torch_encoder = tiny_model(depth=3, drop_path_rate=0.0, encoder="torch")
    ids = sorted(layer_ids(native).values())
    got = layer_ids(torch_encoder)
    assert sorted(got.values()) == ids
    assert got["blocks.layers.2.linear1.weight"] == 3 == got["norm.bias"]


def test_each_step_sets_each_groups_rate_to_the_schedule_times_its_scale(digits):
    train, _ = digits
    model = tiny_model()
    config = cfg(epochs=2, warmup_epochs=1, layer_decay=0.5)
    state = new_run_state(ClassificationTask(model, config), config, batches_per_epoch=3)
    batches = [(torch.stack([train[i][0] for i in range(4)]), torch.arange(4))] * 2
    train_one_epoch(state, batches)
    assert state.step == 2
    scales = sorted({g["lr_scale"] for g in state.optimizer.param_groups})
    assert scales == [0.5**k for k in range(4, -1, -1)]
    for group in state.optimizer.param_groups:
        assert group["lr"] == state.schedule(1) * group["lr_scale"]


def _one_step(model, config, digits):
    """One optimiser step of `fit`'s state on a batch: returns the state."""
    train, _ = digits
    state = new_run_state(ClassificationTask(model, config), config, batches_per_epoch=1)
    images = torch.stack([train[i][0] for i in range(8)])
    train_one_epoch(state, [(images, torch.tensor([train[i][1] for i in range(8)]))])
    return state


@pytest.mark.parametrize("blocks", [0, 2])
def test_frozen_layers_are_unchanged_and_out_of_the_optimiser(blocks, digits):
    model = tiny_model(depth=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = _one_step(model, cfg(freeze=blocks, weight_decay=0.5), digits)
    in_optimizer = {id(p) for g in state.optimizer.param_groups for p in g["params"]}
    frozen = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}
    frozen |= {n for n, _ in model.named_parameters() if n.startswith(("blocks.0.", "blocks.1."))}
    if blocks == 0:
        frozen = {n for n in frozen if not n.startswith("blocks.")}
    for name, param in model.named_parameters():
        if name in frozen:
            assert not param.requires_grad and id(param) not in in_optimizer, name
            assert torch.equal(param, before[name]), name
        else:
            assert param.requires_grad and id(param) in in_optimizer, name
            assert not torch.equal(param, before[name]), name


def test_frozen_run_saves_the_full_model_and_resumes_to_the_same_weights(tmp_path, digits):
    """Layer decay and freezing together: the checkpoint holds every tensor (the frozen ones as
    they were), and a run stopped after one epoch and resumed rebuilds the same groups and ends
    with the weights of an uninterrupted run."""
    train, val = digits
    config = cfg(epochs=2, freeze=1, layer_decay=0.7)
    start = tiny_model().state_dict()
    fit(ClassificationTask(tiny_model(), config), train, val, config, out_dir=tmp_path / "full")
    saved = load(tmp_path / "full" / LAST_FILE).state_dict()
    assert saved.keys() == start.keys()
    for name in ("cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight"):
        assert torch.equal(saved[name], start[name]), name
    assert not torch.equal(saved["blocks.1.attn.qkv.weight"], start["blocks.1.attn.qkv.weight"])

    stop = StopFlag()
    first = fit(
        ClassificationTask(tiny_model(), config),
        train,
        val,
        config,
        out_dir=tmp_path / "cut",
        stop=stop,
        on_epoch_end=lambda row: stop.set("test"),
    )
    assert first.interrupted and len(first.history) == 1
    resumed = fit(
        ClassificationTask(tiny_model(), config),
        train,
        val,
        config,
        out_dir=tmp_path / "cut",
        resume=True,
    )
    assert len(resumed.history) == 2
    again = load(tmp_path / "cut" / LAST_FILE).state_dict()
    assert all(torch.equal(saved[k], again[k]) for k in saved)


def test_linear_probe_trains_only_the_head_with_the_encoder_in_eval_mode(digits):
    model = tiny_model(drop_path_rate=0.5, drop_rate=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: modes.append(module.training))
    state = _one_step(model, cfg(linear_probe=True), digits)
    assert modes == [False]
    trained = {n for g in state.optimizer.param_groups for n, p in model.named_parameters()
               if any(p is q for q in g["params"])}  # fmt: skip
    assert trained == {"head.weight", "head.bias"}
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) == (name not in trained), name


def test_gradient_checkpointing_trains_to_the_same_weights(digits):
    train, val = digits
    plain, checkpointed = tiny_model(drop_path_rate=0.2), tiny_model(drop_path_rate=0.2)
    torch.manual_seed(1)
    fit(ClassificationTask(plain, cfg()), train, val, cfg())
    torch.manual_seed(1)
    fit(ClassificationTask(checkpointed, cfg(grad_ckpt=True)), train, val, cfg(grad_ckpt=True))
    assert checkpointed.grad_checkpointing and not plain.grad_checkpointing
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values()):
        assert torch.equal(a, b), name
    start = tiny_model(drop_path_rate=0.2).state_dict()  # both trained: equal, not untouched
    assert not torch.equal(
        plain.state_dict()["blocks.2.mlp.fc1.weight"], start["blocks.2.mlp.fc1.weight"]
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"linear_probe": True, "freeze": 2}, "linear_probe already freezes everything but the "
         "head; drop freeze, or drop linear_probe to fine-tune the blocks after the frozen ones"),
        ({"linear_probe": True, "distill": "hard"}, "linear_probe freezes the distillation token"),
        ({"layer_decay": 0.0}, "layer_decay must be in (0, 1], got 0.0"),
        ({"layer_decay": 1.5}, "layer_decay must be in (0, 1], got 1.5"),
        ({"freeze": -1}, "freeze must be >= 0, got -1"),
    ],
)  # fmt: skip
def test_conflicts_and_ranges_are_refused_with_one_line(options, message):
    with pytest.raises(ValueError) as err:
        TrainConfig(**options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_model_dependent_mistakes_are_refused(digits):
    with pytest.raises(ValueError, match=r"^freeze 4 is more than the model's 3 blocks; choose 0"):
        _one_step(tiny_model(depth=3), cfg(freeze=4), digits)
    with pytest.raises(ValueError, match=r"^layer_decay needs a vitkit ViT .*; Linear is not one"):
        param_groups(nn.Linear(2, 2), 0.05, 0.7)
    with pytest.raises(ValueError, match=r"^linear_probe needs a vitkit ViT"):
        freeze_layers(nn.Linear(2, 2), linear_probe=True)


def test_cli_fine_tunes_with_the_recipe_and_refuses_conflicts(tmp_path, capsys):
    weights = tmp_path / "pre.safetensors"
    save(tiny_model(depth=2), weights)
    out = tmp_path / "run"
    argv = ["train", "--pretrained", str(weights), "--recipe", "finetune", "--epochs", "1",
            "--train-limit", "64", "--freeze", "0", "--grad-ckpt", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    settings = load(out / "model.safetensors")  # the whole model, loadable as any run's
    assert settings.config.depth == 2
    record = (out / "config.json").read_text()
    assert '"layer_decay": 0.65' in record and '"freeze": 0' in record
    assert RECIPES["finetune"]["layer_decay"] == 0.65
    capsys.readouterr()
    code = cli.main(["train", "--out", str(tmp_path / "x"), "--linear-probe", "--freeze", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("vitkit: error: linear_probe already freezes")
    assert err.count("\n") == 1
