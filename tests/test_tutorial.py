"""docs/tutorials/stage-by-stage.md: the shapes its prose states are in the output it shows
(tests/test_docs.py runs every command and checks that vitkit still prints that output)."""

from __future__ import annotations

import re
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "stage-by-stage.md"


def console_blocks() -> list[tuple[str, str]]:
    """(command, shown output) of every ```console block: a `$ vitkit ...` line, then its
    output up to the closing fence."""
    blocks = re.findall(r"```console\n\$ (vitkit [^\n]*)\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) == TUTORIAL.read_text().count("```console")
    return blocks


BLOCKS = console_blocks()


def shown(command: str) -> str:
    return next(output for cmd, output in BLOCKS if cmd == command)


def _shapes(output: str, stage: str, role: str) -> list[str]:
    """The output shapes of the rows of `stage` whose operation is `role`."""
    return [
        re.findall(r"\([\d, ]+\)", line)[-1]
        for line in output.splitlines()
        if line.startswith(stage) and f"  {role}:" in line
    ]


def test_the_shapes_the_prose_states_are_in_the_output():
    walk = shown(
        "vitkit summary vit_tiny_patch16_224 --img-size 32 --model-opt patch_size=8 --flow"
    )
    assert _shapes(walk, "blocks.0.attn ", "split heads") == ["(3, 1, 3, 17, 64)"]
    assert _shapes(walk, "blocks.0.attn ", "attention logits") == ["(1, 3, 17, 17)"]
    assert _shapes(walk, "  = unfold", "same as") == ["(1, 192, 16)"]
    assert "4x4 grid = 16 patches, 17 tokens" in walk
    base = shown("vitkit summary vit_base_patch16_224 --flow")
    assert "196 patches, 197 tokens" in base and "Total params: 86,567,656 (86.6M)" in base
    assert _shapes(base, "blocks.0.attn ", "attention logits") == ["(1, 12, 197, 197)"]
    wide = next(out for cmd, out in BLOCKS if "--img-size 60 100 --model-opt patch_size=20" in cmd)
    assert "3x5 grid = 15 patches, 16 tokens" in wide
    assert _shapes(wide, "patch_embed.proj", "patch embedding") == ["(1, 192, 3, 5)"]
    torch_flow = next(out for cmd, out in BLOCKS if "encoder=torch" in cmd)
    assert _shapes(torch_flow, "blocks.layers.0.self_attn ", "attention logits") == ["(3, 17, 17)"]
    compared = next(out for cmd, out in BLOCKS if "--compare-torch" in cmd)
    assert re.search(r"^total\s+5,572,264\s+5,572,264$", compared, re.M)


def test_the_swin_shapes_the_prose_states_are_in_its_output():
    swin = shown("vitkit summary swin_tiny_patch4_window7_224 --flow")
    assert _shapes(swin, "patch_embed ", "to map") == ["(1, 56, 56, 96)"]
    assert _shapes(swin, "layers.0.blocks.0 ", "window partition") == ["(64, 49, 96)"]
    assert _shapes(swin, "layers.3.blocks.0 ", "residual")[-1] == "(1, 7, 7, 768)"
    assert "Total params: 28,288,354 (28.3M)" in swin
