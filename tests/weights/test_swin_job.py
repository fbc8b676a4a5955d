"""The job path on a Swin: `vitkit train --pretrained <timm Swin Hub folder> --img-size 56` on
the built-in digits, then `vitkit eval` and `vitkit predict` on the run's model."""

from __future__ import annotations

import json

import numpy as np
import torch
from PIL import Image

import vitkit
from _helpers import optional_import, requires_timm
from vitkit import cli

timm = optional_import("timm")


@requires_timm
def test_fine_tune_a_timm_swin_then_eval_and_predict(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    narrow = dict(in_chans=1, embed_dim=32, num_heads=(1, 2, 4, 8), depths=(1, 1, 2, 1))
    source = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **narrow)
    save_for_hf(source, str(tmp_path / "hub"), safe_serialization=True)
    run = tmp_path / "run"
    argv = ["train", "--pretrained", str(tmp_path / "hub"), "--img-size", "56", "--data",
            "digits", "--epochs", "1", "--train-limit", "64", "--batch-size", "32", "--out",
            str(run), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(run / "model.safetensors")
    assert isinstance(model, vitkit.SwinTransformer)
    assert model.config.num_classes == 10 and model.patch_embed.img_size == (56, 56)
    # maps 14, 7, 4, 2: the last two stages' windows clamp and their tables were resized
    assert model.layers[3].blocks[0].attn.relative_position_bias_table.shape == (9, 8)
    assert model.data_config.input_size == (1, 56, 56)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(run / "model.safetensors"), "--data",
                     "digits", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 359 and 0.0 <= result["acc1"] <= 1.0
    image = tmp_path / "x.png"
    Image.fromarray(np.full((8, 8), 128, dtype=np.uint8)).save(image)
    assert cli.main(["predict", "--checkpoint", str(run), "--topk", "2", str(image)]) == 0
    assert capsys.readouterr().out.startswith(f"{image}: ")
    explained = tmp_path / "e.png"
    assert (
        cli.main(["explain", "--checkpoint", str(run), str(image), "--output", str(explained)]) == 0
    )
    assert capsys.readouterr().out.endswith(f"Grad-CAM in {explained}\n") and explained.is_file()
    # what does not cover a Swin yet says so in one line
    refusals = {
        ("summary", "swin_tiny_patch4_window7_224", "--compare-torch"):
            "is a Swin Transformer: --compare-torch compares ViT encoders",
    }  # fmt: skip
    for argv, message in refusals.items():
        assert cli.main(list(argv)) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # the run's model (a vitkit checkpoint of a Swin) starts another fine-tuning run
    again = tmp_path / "again"
    argv = ["train", "--pretrained", str(run / "model.safetensors"), "--data", "digits",
            "--epochs", "1", "--train-limit", "32", "--out", str(again),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert vitkit.load(again / "model.safetensors").config == model.config
