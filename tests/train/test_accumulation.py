"""Gradient accumulation is a larger batch: `accum_steps=2` at batch B takes the same step as
one batch of 2B (the loss of each micro-batch scaled once by 1/accum_steps), not a step of
another size. Compared with plain SGD, whose step is the learning rate times the gradient, so
a gradient scaled twice (or not at all) moves the weights by half (or twice) as much."""

from __future__ import annotations

import torch

from vitkit import create_model
from vitkit.data import Subset, TensorImages
from vitkit.train import ClassificationTask, TrainConfig, fit


class SgdClassification(ClassificationTask):
    """Classification stepped by plain SGD: the weights move by lr x gradient."""

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=lr)


def one_epoch_of_steps(batch_size: int, accum_steps: int) -> dict[str, torch.Tensor]:
    """The weights after one epoch of 64 images at this batch size and accumulation."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    data = TensorImages(images, labels)
    config = TrainConfig(
        epochs=1, batch_size=batch_size, accum_steps=accum_steps, lr=0.5, warmup_epochs=0,
        mixup=0.0, cutmix=0.0, smoothing=0.0, clip_grad=None, seed=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = create_model("vit_digits", depth=1, drop_path_rate=0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit(SgdClassification(model, config), data, Subset(data, range(8)), config)
    return {k: v - before[k] for k, v in model.state_dict().items()}


def test_two_accumulated_batches_step_as_one_batch_of_twice_the_size():
    accumulated = one_epoch_of_steps(batch_size=16, accum_steps=2)
    whole = one_epoch_of_steps(batch_size=32, accum_steps=1)
    moved = [k for k in whole if whole[k].abs().max() > 0]
    assert "blocks.0.attn.qkv.weight" in moved and "head.weight" in moved
    for key in moved:
        scale = whole[key].abs().max()
        assert (accumulated[key] - whole[key]).abs().max() <= 1e-5 * scale + 1e-7, key
