"""The training engine: parameter groups, schedule, evaluation, resume, EMA, distillation."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn

from _helpers import FixedLogits
from vitkit import create_model, load
from vitkit.data import Subset, TensorImages, Transformed, load_data
from vitkit.inference import predict
from vitkit.train import (
    LAST_FILE,
    RECIPES,
    STATE_FILE,
    ModelEma,
    Schedule,
    ShardSampler,
    StopFlag,
    TrainConfig,
    distill_loss,
    evaluate,
    fit,
    lr_at,
    make_loader,
    param_groups,
)
from vitkit.train.tasks import ClassificationTask


def tiny_model(**kw):
    torch.manual_seed(0)
    return create_model("vit_digits", embed_dim=16, depth=1, num_heads=2, **kw)


@pytest.fixture(scope="module")
def digits():
    splits = load_data("digits", seed=0)
    mean, std = torch.tensor(splits.mean).view(-1, 1, 1), torch.tensor(splits.std).view(-1, 1, 1)

    def norm(x):
        return (x - mean) / std

    train = Transformed(Subset(splits.train, range(160)), norm)
    val = Transformed(Subset(splits.val, range(64)), norm)
    return train, val


def cfg(**kw):
    base = dict(epochs=3, batch_size=32, lr=2e-3, warmup_epochs=1, mixup=0.0, cutmix=0.0)
    base.update(kw)
    return TrainConfig(**base)


def test_param_groups_skip_biases_norms_tokens_and_positions():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert {"cls_token", "pos_embed", "blocks.0.attn.qkv.bias", "norm.weight"} <= skipped
    assert decayed == {
        "patch_embed.proj.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc1.weight",
        "blocks.0.mlp.fc2.weight",
        "head.weight",
    }
    assert len(skipped) + len(decayed) == len(list(model.parameters()))


def test_schedule_values():
    kw = dict(total_steps=110, warmup_steps=10, lr=1e-3, min_lr=1e-5, warmup_lr=1e-6)
    assert lr_at(0, **kw) == pytest.approx(1e-6)
    assert lr_at(5, **kw) == pytest.approx(1e-6 + (1e-3 - 1e-6) / 2)
    assert lr_at(10, **kw) == pytest.approx(1e-3)
    assert lr_at(60, **kw) == pytest.approx((1e-3 + 1e-5) / 2)
    assert lr_at(35, **kw) == pytest.approx(
        1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi / 4))
    )
    assert lr_at(110, **kw) == pytest.approx(1e-5)
    assert lr_at(500, **kw) == pytest.approx(1e-5)


@pytest.mark.parametrize("recipe", ["deit", "small", "fashion-mnist", "finetune"])
def test_no_recipe_warm_up_is_cut(recipe, caplog):
    config = TrainConfig(**RECIPES[recipe])
    caplog.set_level(logging.INFO, logger="vitkit")
    schedule = Schedule.of(config, 1e-3, steps_per_epoch=37)
    assert schedule.warmup_steps == round(config.warmup_epochs * 37)
    assert schedule.total_steps == 37 * config.epochs and not caplog.messages


def test_a_short_run_warms_up_over_a_tenth_of_it_at_most(caplog):
    caplog.set_level(logging.INFO, logger="vitkit")
    schedule = Schedule.of(cfg(epochs=2, warmup_epochs=5, warmup_lr=1e-6), 1e-3, 30)
    assert (schedule.total_steps, schedule.warmup_steps) == (60, 6)
    assert schedule(6) == pytest.approx(1e-3) and schedule(3) == pytest.approx((1e-3 + 1e-6) / 2)
    assert caplog.messages == [
        "warm-up shortened from 5 epochs (150 steps) to 6 steps: at most 10% of the run's 60 steps"
    ]


def test_a_one_step_run_trains_at_the_peak_rate(digits):
    """160 images in one batch, one epoch, DeiT's 5 warm-up epochs: the step is at lr."""
    train, val = digits
    rows = fit(
        ClassificationTask(tiny_model(), cfg(epochs=1, batch_size=160, warmup_epochs=5)),
        train,
        val,
        cfg(epochs=1, batch_size=160, warmup_epochs=5),
    ).history
    assert rows[0]["lr"] == 2e-3


def test_train_config_errors():
    with pytest.raises(ValueError, match="amp='fp16' needs a CUDA device"):
        TrainConfig(amp="fp16")
    with pytest.raises(ValueError, match="unknown amp 'fp8'"):
        TrainConfig(amp="fp8")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TrainConfig(batch_size=0)


def test_shard_sampler_partitions_pads_and_skips():
    ranks = [ShardSampler(10, shuffle=True, seed=1, rank=r, world_size=3) for r in range(3)]
    for s in ranks:
        s.set_epoch(2)
    parts = [s.indices() for s in ranks]
    assert [len(p) for p in parts] == [4, 4, 4] and len(ranks[0]) == 4
    assert set(sum(parts, [])) == set(range(10))
    again = ShardSampler(10, shuffle=True, seed=1, rank=0, world_size=3)
    again.set_epoch(2, start=1)
    assert again.indices() == parts[0][1:] and len(again) == 3
    again.set_epoch(3)
    assert again.indices() != parts[0]
    eval_parts = [
        ShardSampler(10, shuffle=False, rank=r, world_size=3, pad=False).indices() for r in range(3)
    ]
    assert sorted(sum(eval_parts, [])) == list(range(10))


def test_evaluate_exact_metrics_and_confusion():
    table = torch.tensor(
        [[3.0, 2, 1, 0, 0, 0], [0, 1, 3, 2, 0, 0], [0, 0, 0, 0, 1, 5], [1, 0, 0, 0, 0, 0]]
    )
    images = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 1, 2, 2).contiguous()
    labels = torch.tensor([0, 3, 1, 0])
    loader = make_loader(TensorImages(images, labels), 3, train=False)
    out = evaluate(FixedLogits(table), loader, num_classes=6)
    expected_loss = nn.functional.cross_entropy(table, labels).item()
    assert out["loss"] == pytest.approx(expected_loss)
    assert out["acc1"] == pytest.approx(2 / 4)  # rows 0 and 3 correct
    assert out["acc5"] == pytest.approx(3 / 4)  # class 1 is not in row 2's top 5
    assert out["count"] == 4
    assert out["confusion"][3, 2] == 1 and out["confusion"][0, 0] == 2
    assert int(out["confusion"].sum()) == 4
    probs, idx = predict(FixedLogits(table), images[:1], topk=2)
    assert idx.tolist() == [[0, 1]]
    assert probs[0, 0] == pytest.approx(torch.softmax(table[0], 0)[0].item())


def test_fit_writes_run_files_and_learns(tmp_path, digits):
    train, val = digits
    model = tiny_model()
    rows = []
    result = fit(
        ClassificationTask(model, cfg(epochs=4, lr=5e-3), meta={"class_names": list("0123456789")}),
        train,
        val,
        cfg(epochs=4, lr=5e-3),
        out_dir=tmp_path,
        on_epoch_end=rows.append,
    )
    assert [r["epoch"] for r in result.history] == [1, 2, 3, 4] and rows == result.history
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == result.history
    assert {"epoch", "train_loss", "val_loss", "val_acc1", "val_acc5", "lr", "seconds"} <= set(
        lines[0]
    )
    assert lines[-1]["val_acc1"] > 0.15 and lines[-1]["train_loss"] < lines[0]["train_loss"]
    for name in ("model.safetensors", "last.safetensors", "curves.png", STATE_FILE):
        assert (tmp_path / name).is_file()
    best = load(tmp_path / "model.safetensors")
    assert best.meta["class_names"] == list("0123456789")
    assert best.meta["epoch"] == result.best_epoch
    assert best.meta["val_acc1"] == result.best == max(r["val_acc1"] for r in lines)
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    assert state["epoch"] == 4 and state["step"] == 4 * 5


def _weights(path):
    return load(path).state_dict()


@pytest.mark.parametrize("stop_at", ["epoch", "batch"])
def test_resume_gives_the_same_weights(tmp_path, digits, stop_at):
    train, val = digits
    config = cfg(epochs=3, mixup=0.8, cutmix=1.0, ema=0.9, accum_steps=2, clip_grad=1.0)
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config),
        train,
        val,
        config,
        out_dir=tmp_path / "full",
    )

    stop = StopFlag()
    calls = {"n": 0}

    def progress(iterable, total, desc):
        class Bar:
            def __iter__(self):
                yield from iterable

            def set_postfix(self, **kw):
                calls["n"] += 1
                if stop_at == "batch" and calls["n"] == 9:  # epoch 2, 4th batch
                    stop.set("test")

        return Bar()

    def on_epoch_end(row):
        if stop_at == "epoch" and row["epoch"] == 1:
            stop.set("test")

    first = fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config),
        train,
        val,
        config,
        out_dir=tmp_path / "cut",
        stop=stop,
        progress=progress,
        on_epoch_end=on_epoch_end,
    )
    assert first.interrupted
    state = torch.load(tmp_path / "cut" / STATE_FILE, weights_only=True)
    if stop_at == "batch":
        assert state["epoch"] == 1 and state["epoch_state"]["batches"] == 4
    else:
        assert state["epoch"] == 1 and state["epoch_state"] is None
    torch.manual_seed(123)  # the resumed run must not depend on the global seed
    second = fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config),
        train,
        val,
        config,
        out_dir=tmp_path / "cut",
        resume=True,
    )
    assert not second.interrupted and len(second.history) == 3
    full, resumed = _weights(tmp_path / "full" / LAST_FILE), _weights(tmp_path / "cut" / LAST_FILE)
    for key in full:
        assert torch.equal(full[key], resumed[key]), key
    full_ema = _weights(tmp_path / "full" / "ema.safetensors")
    cut_ema = _weights(tmp_path / "cut" / "ema.safetensors")
    assert all(torch.equal(full_ema[k], cut_ema[k]) for k in full_ema)
    a = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val_loss"] for r in a] == [r["val_loss"] for r in b]


def test_resume_without_state_and_with_another_model(tmp_path, digits):
    train, val = digits
    with pytest.raises(FileNotFoundError, match="no training state"):
        fit(
            ClassificationTask(tiny_model(), cfg(epochs=1)),
            train,
            val,
            cfg(epochs=1),
            out_dir=tmp_path,
            resume=True,
        )
    fit(
        ClassificationTask(tiny_model(), cfg(epochs=1)), train, val, cfg(epochs=1), out_dir=tmp_path
    )
    other = create_model("vit_digits", embed_dim=32, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="does not match the model .*wrong shape"):
        fit(
            ClassificationTask(other, cfg(epochs=2)),
            train,
            val,
            cfg(epochs=2),
            out_dir=tmp_path,
            resume=True,
        )


def test_ema_update_math():
    model = nn.Linear(2, 1)
    ema = ModelEma(model, decay=0.75)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(4.0)
    ema.update(model)
    assert torch.allclose(ema.state["weight"], start + 1.0)


def test_distill_losses():
    student = torch.tensor([[2.0, 0.0, 0.0]])
    teacher = torch.tensor([[0.0, 3.0, 0.0]])
    hard = distill_loss(student, teacher, "hard")
    assert hard.item() == pytest.approx(
        nn.functional.cross_entropy(student, torch.tensor([1])).item()
    )
    soft = distill_loss(student, teacher, "soft", tau=2.0)
    p = torch.log_softmax(student / 2, -1)
    q = torch.log_softmax(teacher / 2, -1)
    assert soft.item() == pytest.approx((q.exp() * (q - p)).sum().item() * 4, rel=1e-5)
    assert distill_loss(teacher, teacher, "soft").item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_fit_with_a_teacher(digits, mode):
    train, val = digits
    teacher = tiny_model()
    student = tiny_model(distilled=True)
    result = fit(
        ClassificationTask(student, cfg(epochs=1, distill=mode), teacher=teacher),
        train,
        val,
        cfg(epochs=1, distill=mode),
    )
    assert len(result.history) == 1 and math.isfinite(result.history[0]["train_loss"])
    with pytest.raises(ValueError, match="needs a student built with distilled=True"):
        fit(
            ClassificationTask(tiny_model(), cfg(epochs=1, distill=mode), teacher=teacher),
            train,
            val,
            cfg(epochs=1, distill=mode),
        )
    with pytest.raises(ValueError, match="needs a teacher model"):
        fit(
            ClassificationTask(student, cfg(epochs=1, distill=mode)),
            train,
            val,
            cfg(epochs=1, distill=mode),
        )
    with pytest.raises(ValueError, match="the teacher predicts 7 classes, the student 10; "):
        fit(
            ClassificationTask(
                student, cfg(epochs=1, distill=mode), teacher=tiny_model(num_classes=7)
            ),
            train,
            val,
            cfg(epochs=1, distill=mode),
        )


def test_bf16_autocast_on_cpu(digits):
    train, val = digits
    result = fit(
        ClassificationTask(tiny_model(), cfg(epochs=1, amp="bf16")),
        train,
        val,
        cfg(epochs=1, amp="bf16"),
    )
    assert math.isfinite(result.history[0]["val_loss"])


@pytest.mark.slow
def test_fit_with_torch_compile(digits):
    train, val = digits
    result = fit(
        ClassificationTask(tiny_model(), cfg(epochs=1, compile=True)),
        train,
        val,
        cfg(epochs=1, compile=True),
    )
    assert math.isfinite(result.history[0]["val_loss"])
