"""`vitkit explain`: one PNG of the maps over the image."""

from __future__ import annotations

import pytest

from ._cli import PNG, digit_png, photo, tiny_checkpoint, torchvision_pth


def test_explain_draws_png(trained, tmp_path, run_cli):
    digit_png(tmp_path / "a.png", 3)
    out_png = tmp_path / "explain.png"
    code, out, _ = run_cli(
        "explain",
        "--checkpoint",
        trained / "model.safetensors",
        tmp_path / "a.png",
        "--output",
        out_png,
        "--per-head",
    )
    assert code == 0 and out_png.read_bytes()[:8] == PNG
    assert f"attention maps in {out_png}" in out


def test_the_picture_is_named_after_the_image_by_default(trained, tmp_path, run_cli, monkeypatch):
    digit_png(tmp_path / "seven.png", 7)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, _ = run_cli(
        "explain", "--checkpoint", trained / "model.safetensors", tmp_path / "seven.png"
    )
    assert code == 0 and (work / "seven_explain.png").read_bytes()[:8] == PNG
    assert out.endswith("attention maps in seven_explain.png\n")
    assert sorted(p.name for p in work.iterdir()) == ["seven_explain.png"]


def test_explain_takes_a_torchvision_state_dict(tmp_path, run_cli):
    pytest.importorskip("torchvision")
    torchvision_pth(tmp_path / "tv.pth")
    image = photo(tmp_path / "photo.png")
    out = tmp_path / "e.png"
    code, printed, _ = run_cli("explain", "--checkpoint", tmp_path / "tv.pth", image,
                               "--output", out)  # fmt: skip
    assert code == 0 and out.read_bytes()[:8] == PNG
    assert printed.startswith(f"{image}: ") and printed.endswith(f"attention maps in {out}\n")


def test_the_maps_lie_on_the_pixels_the_model_saw(tmp_path, run_cli):
    """A centre crop of a 3:1 image: the printed line says which pixels the maps lie on, and
    the probabilities are those of the model on exactly that view."""
    import torch

    from vitkit import load
    from vitkit.data import eval_transform, open_image

    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["cat", "dog"])
    image = photo(tmp_path / "wide.png", size=(48, 16))
    png = tmp_path / "e.png"
    code, out, _ = run_cli("explain", "--checkpoint", checkpoint, image, "--output", png,
                           "--crop-pct", "0.5", "--interpolation", "bilinear")  # fmt: skip
    model = load(checkpoint)
    config = model.data_config.replace(crop_pct=0.5, crop_mode="center", interpolation="bilinear")
    with torch.no_grad():
        probs = torch.softmax(model(eval_transform(config)(open_image(image))[None]), -1)[0]
    k = int(probs.argmax())
    name, p = ["cat", "dog"][k], float(probs[k])
    assert (code, out) == (
        0,
        f"{image}: {name} ({p:.4f}); explained class {name} ({p:.4f}); maps over the model's "
        f"8x8 view: the centre 8x8 of the 48x16 image; attention maps in {png}\n",
    )
    assert png.read_bytes()[:8] == PNG
