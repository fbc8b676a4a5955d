"""Explaining a Swin: Grad-CAM on the last stage's normed map (`vitkit.explain.grad_cam`),
through `explain_image`, `vitkit explain` and the server's /explain."""

import pytest
import torch

from vitkit import SwinConfig, SwinTransformer
from vitkit.explain import explain_image, explanation_method, grad_cam

# 32x32 images, patch 4: an 8x8 patch grid (4x4 windows), then a 4x4 last map of 8x8-pixel cells
NARROW = dict(img_size=32, in_chans=1, embed_dim=32, depths=(1, 1), num_heads=(2, 4),
              window_size=4, drop_path_rate=0.0)  # fmt: skip
CELL, CELLS, REGION, DISTRACTOR = 8, 4, (2, 1), (0, 3)


def test_the_signed_map_is_the_logit_decomposed_over_the_last_map():
    """With average pooling the channel weights are the head's row over h * w: the cells sum
    to the explained logit minus its bias, for any class (CAM's identity)."""
    torch.manual_seed(0)
    model = SwinTransformer(SwinConfig(num_classes=5, **NARROW))
    torch.nn.init.normal_(model.head.fc.bias)
    images = torch.randn(3, 1, 32, 32)
    for target in (0, 4):
        maps = grad_cam(model, images, target=target)
        logit = maps["logits"][:, target] - model.head.fc.bias[target]
        torch.testing.assert_close(maps["signed"].sum((1, 2)), logit, rtol=1e-4, atol=1e-5)
        assert maps["relevance"].shape == (3, CELLS, CELLS)
        assert (maps["relevance"] >= 0).all()
        assert torch.equal(maps["relevance"], maps["signed"].clamp(min=0))
    assert not torch.allclose(grad_cam(model, images, target=0)["signed"], maps["signed"])
    assert torch.equal(maps["target"], torch.tensor([4, 4, 4]))
    assert torch.equal(grad_cam(model, images)["target"], maps["logits"].argmax(-1))


def test_a_frozen_model_in_training_mode_and_another_input_size():
    model = SwinTransformer(SwinConfig(num_classes=3, dynamic_img_size=True, **NARROW))
    model.train().requires_grad_(False)
    maps = grad_cam(model, torch.randn(1, 1, 64, 32), target=2)
    assert model.training and maps["relevance"].shape == (1, 8, 4)
    assert maps["signed"].abs().sum() > 0 and all(p.grad is None for p in model.parameters())
    assert explanation_method(model) == "gradcam"
    with pytest.raises(ValueError, match="class 3 is out of range for a model with 3 classes"):
        grad_cam(model, torch.randn(1, 1, 32, 32), target=3)
    unpooled = SwinTransformer(SwinConfig(num_classes=3, global_pool="none", **NARROW))
    with pytest.raises(ValueError, match=r"this head gives \(1, 4, 4, 3\) \(global_pool='none'"):
        grad_cam(unpooled, torch.randn(1, 1, 32, 32))


# -- a model whose logits only one region's content reaches: the map is there -------------


@pytest.fixture(scope="module")
def local_swin():
    """A Swin whose every cell of the last map sees only its own 8x8 pixels: each attention
    branch closed (zero projection), no biases anywhere, so a zero region stays zero up to the
    head; its logits come from the regions with content only."""
    torch.manual_seed(3)
    model = SwinTransformer(SwinConfig(num_classes=2, **NARROW)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or name.endswith("attn.proj.weight"):
                param.zero_()
    return model


@pytest.mark.parametrize("top, left", [(0, 2), (2, 0)])  # top right, bottom left: not transposed
def test_grad_cam_lies_on_the_only_region_that_reaches_the_logit(local_swin, top, left):
    images = torch.zeros(4, 1, 32, 32)
    quadrant = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(top))
    images[:, :, top * CELL : top * CELL + 16, left * CELL : left * CELL + 16] = quadrant
    maps = grad_cam(local_swin, images)
    relevance = maps["relevance"]  # (B, 4, 4): the quadrant is 2x2 cells
    inside = relevance[:, top : top + 2, left : left + 2].sum((1, 2))
    assert (inside > 0).all()
    torch.testing.assert_close(inside, relevance.sum((1, 2)))
    blank = grad_cam(local_swin, torch.zeros(1, 1, 32, 32))
    assert (blank["signed"] == 0).all()


@pytest.fixture(scope="module")
def region_swin(local_swin):
    """The local Swin and images whose top-right quadrant alone holds content."""
    images = torch.zeros(2, 1, 32, 32)
    images[:, :, :16, 16:] = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    return local_swin, (images, local_swin(images).argmax(-1))


def test_cli_explain_draws_grad_cam_of_a_swin_checkpoint(region_swin, tmp_path, capsys):
    from PIL import Image

    from vitkit import save
    from vitkit.cli import main

    model, (images, labels) = region_swin
    names = ["dark", "bright"]
    ckpt = tmp_path / "swin.safetensors"
    save(model, ckpt, meta={"class_names": names, "mean": [0.0], "std": [1.0]})
    Image.fromarray((images[0, 0] * 255).round().byte().numpy()).save(tmp_path / "x.png")
    out = tmp_path / "explain.png"
    argv = ["explain", "--checkpoint", str(ckpt), str(tmp_path / "x.png"), "--output", str(out)]
    other = 1 - int(labels[0])
    assert main([*argv, "--class", names[other]]) == 0
    printed = capsys.readouterr().out
    assert (
        f": {names[int(labels[0])]} (" in printed and f"explained class {names[other]} (" in printed
    )
    with Image.open(out) as png:
        assert png.width > 2 * 150  # the view and the Grad-CAM panel
    assert main([*argv, "--per-head"]) == 2
    assert "--per-head, --head-fusion and --discard-ratio are the ViT's" in capsys.readouterr().err


def test_explain_image_of_a_swin_gives_its_grad_cam(region_swin, tmp_path):
    from PIL import Image

    from vitkit.data.data_config import DataConfig
    from vitkit.data.images import image_to_tensor, open_image

    model, (images, labels) = region_swin
    path = tmp_path / "x.png"
    Image.fromarray((images[1, 0] * 255).round().byte().numpy()).save(path)
    config = DataConfig(input_size=(1, 32, 32), mean=(0.0,), std=(1.0,), crop_pct=1.0)
    explained = explain_image(model, path, config, target=int(labels[1]))
    assert set(explained.maps) == {"logits", "target", "relevance", "signed"}
    assert explained.maps["relevance"].shape == (CELLS, CELLS)
    pixels = image_to_tensor(open_image(path, in_chans=1))[None]  # (1, 1, 32, 32)
    expected = grad_cam(model, pixels, target=int(labels[1]))
    torch.testing.assert_close(explained.maps["relevance"], expected["relevance"][0])
    with pytest.raises(ValueError, match="no attention heads over the whole image"):
        explain_image(model, path, config, per_head=True)


def test_the_figure_title_sits_above_the_panel_titles(monkeypatch, tmp_path):
    import vitkit.explain.image as image

    figures = []
    monkeypatch.setattr(image, "save_figure", lambda fig, path: figures.append(fig))
    maps = {"relevance": torch.rand(2, 2), "target": torch.tensor(1)}
    image.draw_explanation(torch.rand(3, 32, 32), maps, tmp_path / "x.png", title="a.png: 1",
                           caption="maps over the model's 32x32 view: ...")  # fmt: skip
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    bottom = fig._suptitle.get_window_extent(renderer).y0
    assert all(ax.title.get_window_extent(renderer).y1 <= bottom for ax in fig.axes if ax.title)
