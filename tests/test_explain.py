"""Attention rollout, class-token attention and their pictures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model
from vitkit.data import eval_transform
from vitkit.data.data_config import DataConfig
from vitkit.explain import (
    attention_maps,
    attention_rollout,
    cls_attention,
    draw_explanation,
    explain_image,
    overlay_figure,
    overlay_pixels,
)
from vitkit.inference import predict

PNG = b"\x89PNG\r\n\x1a\n"


def _random_attention(b, h, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h, n, n, generator=g), dim=-1)


def test_rollout_matches_a_numpy_reference():
    attentions = [_random_attention(2, 3, 5, s) for s in range(3)]  # 1 prefix + 2x2 patches
    out = attention_rollout(attentions, num_prefix_tokens=1, grid=(2, 2))
    for b in range(2):
        ref = np.eye(5)
        for a in attentions:
            fused = a[b].mean(0).double().numpy() * 0.5 + np.eye(5) * 0.5
            fused /= fused.sum(-1, keepdims=True)
            ref = fused @ ref
        np.testing.assert_allclose(out[b].numpy(), ref[0, 1:].reshape(2, 2), rtol=1e-5)
    assert out.shape == (2, 2, 2) and float(out.sum(dim=(1, 2)).max()) <= 1.0


def test_rollout_of_identity_attention_stays_on_the_class_token():
    eye = torch.eye(5).expand(1, 2, 5, 5)
    assert torch.equal(
        attention_rollout([eye, eye], num_prefix_tokens=1, grid=(2, 2)), torch.zeros(1, 2, 2)
    )
    with pytest.raises(ValueError, match="unknown head_fusion 'median'"):
        attention_rollout([eye], num_prefix_tokens=1, grid=(2, 2), head_fusion="median")


def test_cls_attention_per_head():
    a = _random_attention(1, 2, 6, 0)  # 2 prefix tokens + 2x2 patches
    out = cls_attention(a, num_prefix_tokens=2, grid=(2, 2))
    assert out.shape == (1, 2, 2, 2)
    assert torch.equal(out[0, 1].flatten(), a[0, 1, 0, 2:])


def test_attention_maps_from_a_model(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_digits", depth=2, distilled=True)
    images = torch.randn(3, 1, 8, 8)
    maps = attention_maps(model, images)
    assert maps["logits"].shape == (3, 10)
    assert maps["rollout"].shape == (3, 4, 4)
    assert maps["cls_attention_heads"].shape == (3, 4, 4, 4)
    assert torch.allclose(maps["cls_attention"], maps["cls_attention_heads"].mean(1))
    path = tmp_path / "x.png"
    draw_explanation(
        images[0].sigmoid(), {k: v[0] for k, v in maps.items()}, path, title="test", per_head=True
    )
    assert path.read_bytes()[:8] == PNG


# -- rollout with a discard ratio, class-specific relevance ------------------------------------


def _numpy_rollout(attentions, discard_ratio, b):
    """vit-explain's loop for image b (rows renormalised by their own sums)."""
    n = attentions[0].shape[-1]
    result = np.eye(n)
    for a in attentions:
        fused = a[b].mean(0).double().numpy().copy()
        flat = fused.reshape(-1)
        lowest = np.argsort(flat, kind="stable")[: int(n * n * discard_ratio)]
        flat[lowest[lowest != 0]] = 0
        fused = (fused + np.eye(n)) / 2
        fused /= fused.sum(-1, keepdims=True)
        result = fused @ result
    return result


@pytest.mark.parametrize("discard_ratio", [0.0, 0.5, 0.9])
def test_rollout_with_discard_matches_a_numpy_reference(discard_ratio):
    attentions = [_random_attention(2, 3, 5, s) for s in range(3)]
    out = attention_rollout(
        attentions, num_prefix_tokens=1, grid=(2, 2), discard_ratio=discard_ratio
    )
    for b in range(2):
        ref = _numpy_rollout(attentions, discard_ratio, b)
        np.testing.assert_allclose(out[b].numpy(), ref[0, 1:].reshape(2, 2), rtol=1e-5)


def test_discard_keeps_the_class_tokens_own_attention():
    a = torch.full((1, 1, 3, 3), 0.5)
    a[0, 0, 0, 0] = 0.0  # the lowest entry, yet never discarded
    a[0, 0, 1, 2] = 0.9
    got = attention_rollout([a], num_prefix_tokens=1, grid=(1, 2), discard_ratio=0.8)
    # 7 of 9 entries zeroed: all but (1, 2) and the kept (0, 0); row 0 is then (0, 0, 0) + I / 2
    assert torch.equal(got, torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match=r"discard_ratio must be in \[0, 1\), got 1.0"):
        attention_rollout([a], num_prefix_tokens=1, grid=(1, 2), discard_ratio=1.0)


def _chefer_reference(model, x, target):
    """Chefer et al.'s loop, one image at a time: attention gradients from retain_grad and a
    backward pass of the target logit, R += mean_heads(clamp(grad * A, 0)) @ R in float64."""
    out = []
    for b in range(x.shape[0]):
        logits, attentions = model(x[b : b + 1], return_attention=True)
        for a in attentions:
            a.retain_grad()
        logits[0, int(target[b])].backward()
        n = attentions[0].shape[-1]
        r = np.eye(n)
        for a in attentions:
            cam = (a.grad[0].double() * a[0].detach().double()).clamp(min=0).mean(0).numpy()
            r = r + cam @ r
        out.append(r)
    return np.stack(out)


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_relevance_matches_chefers_loop(pool):
    torch.manual_seed(0)
    model = create_model("vit_digits", depth=3, global_pool=pool).eval()
    x = torch.randn(3, 1, 8, 8)
    maps = attention_maps(model, x)
    predicted = maps["logits"].argmax(-1)
    assert torch.equal(maps["target"], predicted)
    ref = _chefer_reference(model, x, predicted)
    rows = ref[:, 0, 1:] if pool == "token" else ref[:, 1:, 1:].mean(1)
    np.testing.assert_allclose(maps["relevance"].flatten(1).numpy(), rows, rtol=1e-4, atol=1e-7)
    chosen = attention_maps(model, x, target=[4, 0, 9])
    ref = _chefer_reference(model, x, [4, 0, 9])
    rows = ref[:, 0, 1:] if pool == "token" else ref[:, 1:, 1:].mean(1)
    np.testing.assert_allclose(chosen["relevance"].flatten(1).numpy(), rows, rtol=1e-4, atol=1e-7)
    assert chosen["target"].tolist() == [4, 0, 9]
    with pytest.raises(ValueError, match="class 10 is out of range for a model with 10 classes"):
        attention_maps(model, x, target=10)


def test_maps_of_a_frozen_model_in_training_mode():
    model = create_model("vit_digits", depth=2).train().requires_grad_(False)
    maps = attention_maps(model, torch.randn(2, 1, 8, 8), target=3)
    assert model.training and maps["relevance"].shape == (2, 4, 4)
    assert maps["relevance"].sum() > 0 and all(p.grad is None for p in model.parameters())


# -- a task decided by one region: the class-specific map finds it ---------------------------

PATCH, GRID, REGION, DISTRACTOR = 4, 4, (2, 1), (0, 3)


def _patterns() -> torch.Tensor:
    r = torch.arange(PATCH)
    rows = (r[:, None] % 2).float().expand(PATCH, PATCH)  # horizontal stripes
    checker = ((r[:, None] + r[None, :]) % 2).float()
    blocks = ((r[:, None] // 2 + r[None, :] // 2) % 2).float()
    return torch.stack([rows, rows.T, checker, blocks])  # (4, P, P)


def _region_task(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16x16 noise images; the pattern in the REGION patch is the class; the DISTRACTOR patch
    holds a pattern of a random class, which decides nothing."""
    patterns = _patterns()
    labels = torch.randint(0, len(patterns), (n,), generator=generator)
    images = torch.rand(n, 1, GRID * PATCH, GRID * PATCH, generator=generator)
    noise = torch.randint(0, len(patterns), (n,), generator=generator)
    for (i, j), kinds in ((REGION, labels), (DISTRACTOR, noise)):
        images[:, 0, i * PATCH : (i + 1) * PATCH, j * PATCH : (j + 1) * PATCH] = patterns[kinds]
    return images, labels


@pytest.fixture(scope="module")
def region_model():
    """A 2-block ViT trained for a few seconds on the task (reaches 100% test accuracy)."""
    torch.manual_seed(1)
    generator = torch.Generator().manual_seed(1)
    images, labels = _region_task(1024, generator)
    test = _region_task(192, generator)
    model = create_model(
        "vit_digits", img_size=16, patch_size=PATCH, num_classes=4, embed_dim=32, depth=2,
        num_heads=2,
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: threads only contend
    try:
        for _ in range(10):
            order = torch.randperm(len(images), generator=generator)
            for start in range(0, len(images), 64):
                batch = order[start : start + 64]
                loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), test


def test_class_relevance_peaks_in_the_deciding_region(region_model):
    model, (images, labels) = region_model
    with torch.no_grad():
        assert (model(images).argmax(-1) == labels).float().mean() >= 0.95
    maps = attention_maps(model, images, target=labels)
    relevance = maps["relevance"]  # (B, 4, 4)
    region, distractor = (
        relevance[:, REGION[0], REGION[1]],
        relevance[:, DISTRACTOR[0], DISTRACTOR[1]],
    )
    peak = relevance.flatten(1).argmax(-1)
    assert divmod(int(relevance.mean(0).argmax()), GRID) == REGION
    assert (peak == REGION[0] * GRID + REGION[1]).float().mean() >= 0.9
    assert region.mean() > 10 * distractor.mean()  # as salient a pattern, but not deciding


def test_cli_explain_class_over_the_image_at_its_own_size(region_model, tmp_path, capsys):
    from PIL import Image

    from vitkit import save
    from vitkit.cli import main

    model, (images, labels) = region_model
    names = ["rows", "columns", "checker", "blocks"]
    ckpt = tmp_path / "model.safetensors"
    save(model, ckpt, meta={"class_names": names, "mean": [0.0], "std": [1.0]})
    big = images[0, 0].clamp(0, 1).repeat_interleave(3, 0).repeat_interleave(3, 1)  # 48x48
    Image.fromarray((big * 255).round().byte().numpy()).save(tmp_path / "x.png")
    out = tmp_path / "explain.png"
    argv = ["explain", "--checkpoint", str(ckpt), str(tmp_path / "x.png"), "--output", str(out)]
    other = (int(labels[0]) + 1) % 4
    assert main([*argv, "--class", names[other], "--per-head", "--discard-ratio", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert f": {names[int(labels[0])]} (" in printed
    assert f"explained class {names[other]} (" in printed and printed.endswith(f"in {out}\n")
    with Image.open(out) as png:
        assert png.width > 4 * 200 and png.height > 2 * 150  # 4 panels, a row of 2 heads
    code = main([*argv, "--class", "zebra"])
    assert code == 2 and capsys.readouterr().err == (
        "vitkit: error: --class 'zebra' is not a class of this checkpoint; give a name (rows, "
        "columns, checker, blocks) or an index 0 to 3\n"
    )
    assert main([*argv, "--discard-ratio", "1"]) == 2
    assert "--discard-ratio must be in [0, 1), got 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options", [dict(global_pool="max"), dict(global_pool="map", class_token=False, reg_tokens=1)]
)
def test_maps_of_a_model_without_a_class_token_readout_read_the_patch_rows(options):
    """max / map pooling reads no class-token row: every map is the patch rows' mean (with the
    register token skipped), never row 0 (a patch or a register when there is no class token)."""
    from vitkit import VisionTransformer
    from vitkit.explain import readout_of

    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3,
                              num_classes=4, **options).eval()  # fmt: skip
    x = torch.randn(2, 3, 16, 16)
    maps = attention_maps(model, x)
    with torch.no_grad():
        _, attentions = model(x, return_attention=True)
    prefix = model.num_prefix_tokens
    assert readout_of(model) == "mean"
    expected = attentions[-1][:, :, prefix:, prefix:].mean(2).reshape(2, 3, 4, 4)
    torch.testing.assert_close(maps["cls_attention_heads"], expected)
    common = dict(num_prefix_tokens=prefix, grid=(4, 4), readout="mean")
    torch.testing.assert_close(maps["rollout"], attention_rollout(list(attentions), **common))


LUMA = torch.tensor([0.299, 0.587, 0.114])  # ITU-R BT.601 lightness of RGB


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.flatten().numpy(), b.flatten().numpy())[0, 1])


def test_the_overlay_lets_a_digit_show_through():
    """The lightness of a map laid over a grey digit follows the digit (the digit reads under
    any map): above 0.93 on average over ten digits and random maps, where the earlier
    overlay (jet at half opacity) is below it."""
    from matplotlib import colormaps
    from sklearn.datasets import load_digits

    digits = load_digits()
    generator = torch.Generator().manual_seed(0)
    new, old = [], []
    for index in range(10):
        digit = torch.from_numpy(digits.images[index] / 16).float()[None]  # (1, 8, 8) in [0, 1]
        heat = torch.rand(4, 4, generator=generator)
        overlay = overlay_pixels(digit, heat)
        assert overlay.shape == (8, 8, 3) and 0 <= overlay.min() and overlay.max() <= 1
        new.append(_correlation(overlay @ LUMA, digit))
        up = torch.nn.functional.interpolate(heat[None, None], size=(8, 8), mode="bilinear")[0, 0]
        scaled = ((up - up.min()) / (up.max() - up.min())).numpy()
        jet = torch.from_numpy(colormaps["jet"](scaled)[..., :3])
        earlier = 0.5 * digit[0, ..., None] + 0.5 * jet.float()  # grey under jet at 0.5
        old.append(_correlation(earlier @ LUMA, digit))
    assert np.mean(new) > 0.93 > np.mean(old), (np.mean(new), np.mean(old))
    assert min(new) > 0.9


def test_the_overlay_figure_has_a_colour_bar_and_a_caption():
    """One panel of the map over the (enlarged) view, a colour bar spanning the map's values,
    and the title and caption above."""
    from vitkit.plots import pyplot

    heat = torch.tensor([[0.0, 0.2], [0.3, 0.9]])
    title = "predicted 7 (0.912); attention relevance for class 7"
    fig = overlay_figure(torch.rand(1, 8, 16), heat, title=title, caption="the 16x8 view")
    try:
        panel, bar = fig.axes
        assert panel.images[0].get_array().shape == (224, 448, 3)  # 8x16 enlarged, grey in RGB
        assert bar.get_ylim() == pytest.approx((0.0, 0.9))  # the bar spans the map's values
        assert bar.collections[0].cmap.name == "viridis"
        assert fig._suptitle.get_text() == f"{title}\nthe 16x8 view"
    finally:
        pyplot().close(fig)


def test_the_last_panel_names_what_is_read(tmp_path, monkeypatch):
    """A model pooling its class token shows the class token's attention; any other pooling
    shows the patch tokens' mean attention, and the panel says so."""
    from matplotlib.axes import Axes

    from vitkit.explain import readout_of

    titles = []
    real = Axes.set_title
    monkeypatch.setattr(Axes, "set_title", lambda ax, t, **kw: titles.append(t) or real(ax, t))
    torch.manual_seed(0)
    images = torch.randn(1, 1, 8, 8)
    for pool, expected in (("token", "last-layer [CLS] attention"),
                           ("map", "last-layer mean patch attention")):  # fmt: skip
        model = create_model("vit_digits", depth=1, global_pool=pool)
        maps = attention_maps(model, images)
        titles.clear()
        draw_explanation(images[0].sigmoid(), {k: v[0] for k, v in maps.items()},
                         tmp_path / f"{pool}.png", readout=readout_of(model))  # fmt: skip
        assert expected in titles


# -- explain_image: the maps over exactly the pixels the model saw ---------------------------


def _three_to_one(path, height=24):
    """A 3:1 picture: red left third, green middle, blue right third (a gradient inside each,
    so that a shifted crop shows)."""
    width = 3 * height
    array = np.zeros((height, width, 3), dtype=np.uint8)
    ramp = np.linspace(60, 250, height).astype(np.uint8)[:, None]
    for third in range(3):
        array[:, third * height : (third + 1) * height, third] = ramp
    Image.fromarray(array).save(path)
    return path


def _capture_figure(monkeypatch):
    """The figure `draw_explanation` saves (it is still written to its file)."""
    import vitkit.explain.image as explain

    figures = []
    real = explain.save_figure

    def keep(fig, path):
        figures.append([[im.get_array().copy() for im in ax.images] for ax in fig.axes])
        figures.append([ax.get_title() for ax in fig.axes] + [fig._suptitle.get_text()])
        real(fig, path)

    monkeypatch.setattr(explain, "save_figure", keep)
    return figures


VIEWS = {  # data config -> what the model sees of a 72x24 (3:1) picture
    "center crop": dict(crop_mode="center", crop_pct=0.75),
    "center, no margin": dict(crop_mode="center", crop_pct=1.0),
    "squash": dict(crop_mode="squash", crop_pct=1.0),
    "squash and crop": dict(crop_mode="squash", crop_pct=0.8),
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS)
def test_explain_draws_over_exactly_the_pixels_the_model_saw(tmp_path, monkeypatch, view):
    path = _three_to_one(tmp_path / "wide.png")
    torch.manual_seed(0)
    model = create_model("vit_digits", img_size=16, patch_size=4, in_chans=3, embed_dim=16,
                         depth=2, num_heads=2).eval()  # fmt: skip
    config = DataConfig(input_size=(3, 16, 16), mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25),
                        interpolation="bicubic", **view)  # fmt: skip
    figures = _capture_figure(monkeypatch)
    out = tmp_path / "explained.png"
    result = explain_image(model, path, config, out=out, per_head=True)
    seen = eval_transform(config)(Image.open(path).convert("RGB"))  # what the model is fed
    mean, std = torch.tensor(config.mean).view(3, 1, 1), torch.tensor(config.std).view(3, 1, 1)
    torch.testing.assert_close(result.image, seen * std + mean, atol=1e-6, rtol=0)
    with torch.no_grad():
        logits = model(seen[None])[0]
    torch.testing.assert_close(result.maps["logits"], logits, atol=1e-5, rtol=0)
    assert result.predicted == int(logits.argmax()) == result.target
    # every panel but the file's own shows the view, at the model's resolution
    images, titles = figures
    view_panels = [ims[0] for ims, title in zip(images, titles) if ims and "file" not in title]
    assert len(view_panels) == 4 + 2  # the view, three maps, two heads
    np.testing.assert_allclose(view_panels[0], result.image.permute(1, 2, 0).numpy(), atol=1e-6)
    heads = list(result.maps["cls_attention_heads"])
    maps = [result.maps[name] for name in ("relevance", "rollout", "cls_attention")] + heads
    for drawn, heat in zip(view_panels[1:], maps):  # each map over that view
        np.testing.assert_allclose(drawn, overlay_pixels(result.image, heat).numpy(), atol=1e-6)
    assert out.read_bytes()[:8] == PNG
    cropped = view != VIEWS["squash"]  # every other view leaves part of the 3:1 file out
    assert ("the file; the model saw the box" in titles) == cropped
    if cropped:  # the file panel shows the whole original
        (original,) = images[titles.index("the file; the model saw the box")]
        assert original.shape == (24, 72, 3)


def test_a_centre_crop_of_a_wide_image_is_its_middle(tmp_path):
    """On the 3:1 picture a centre crop sees only the green middle: the region, the caption
    and the view's colours say so; squashing sees all three."""
    path = _three_to_one(tmp_path / "wide.png")
    torch.manual_seed(0)
    model = create_model("vit_digits", img_size=16, patch_size=4, in_chans=3, embed_dim=16,
                         depth=1, num_heads=2)  # fmt: skip
    base = dict(input_size=(3, 16, 16), mean=0.5, std=0.5, interpolation="bilinear")
    crop = explain_image(model, path, DataConfig(**base, crop_pct=0.5))
    assert crop.region == (6.0, 30.0, 18.0, 42.0)  # resized to 96x32: its centre 16x16
    assert crop.caption == (
        "maps over the model's 16x16 view: the 72x24 image resized to 96x32, its centre 16x16"
    )
    no_resize = explain_image(model, path, DataConfig(**base, crop_pct=2 / 3))
    assert no_resize.region == (4.0, 28.0, 20.0, 44.0)
    assert (
        no_resize.caption == "maps over the model's 16x16 view: the centre 16x16 of the 72x24 image"
    )
    means = crop.image.mean(dim=(1, 2))
    assert means[1] > 0.5 and means[0] == means[2] == 0  # only green
    squash = explain_image(model, path, DataConfig(**base, crop_mode="squash"))
    assert squash.region == (0.0, 0.0, 24.0, 72.0)
    assert squash.caption == "maps over the model's 16x16 view: the 72x24 image squashed to 16x16"
    assert (squash.image.amax(dim=(1, 2)) > 0.5).all()  # red, green and blue
    assert squash.original.shape == (3, 24, 72)


@pytest.mark.parametrize("multi_label", [False, True])
def test_explained_probabilities_are_the_ones_predict_gives(tmp_path, multi_label):
    """A multi-label model's caption and probabilities are each class's sigmoid, as
    `vitkit predict` prints them; a single-label model's a softmax."""
    path = _three_to_one(tmp_path / "wide.png")
    torch.manual_seed(0)
    model = create_model("vit_digits", img_size=16, patch_size=4, in_chans=3, embed_dim=16,
                         depth=1, num_heads=2).eval()  # fmt: skip
    model.meta = {"multi_label": multi_label}
    config = DataConfig(input_size=(3, 16, 16), mean=0.5, std=0.5, interpolation="bilinear")
    result = explain_image(model, path, config)
    expected, _ = predict(model, eval_transform(config)(Image.open(path).convert("RGB"))[None],
                          topk=10, multi_label=multi_label)  # fmt: skip
    torch.testing.assert_close(result.probabilities.sort(descending=True).values, expected[0])
    assert torch.isclose(result.probabilities.sum(), torch.tensor(1.0)) != multi_label
