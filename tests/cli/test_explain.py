"""`vitkit explain`: one PNG of the maps over the image."""

from __future__ import annotations

from ._cli import PNG, digit_png


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
