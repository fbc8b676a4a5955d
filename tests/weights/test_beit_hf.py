"""Hugging Face's BEiT and Data2Vec vision models (`BeitModel`, `BeitForImageClassification`,
`Data2VecVisionModel`, `Data2VecVisionForImageClassification`): folders written by
`save_pretrained` (the Hub file layout) and transformers 5's module state dicts load as vitkit
BEiTs with transformers' outputs within 1e-5; their keys are told from a ViT's; what a faithful
copy cannot be is refused in one line."""

from __future__ import annotations

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, requires_transformers
from vitkit import CheckpointError, cli
from vitkit.weights.families import reading_family

transformers = optional_import("transformers")
SMALL = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=2, intermediate_size=128)  # fmt: skip
# (model class, config class, config options): every kind of key and head.
KINDS = {
    "beit, per-block tables": ("BeitForImageClassification", "BeitConfig",
                               dict(use_relative_position_bias=True, num_labels=3)),
    "beit, shared table, positions, class token": (
        "BeitForImageClassification", "BeitConfig",
        dict(use_shared_relative_position_bias=True, use_absolute_position_embeddings=True,
             use_mean_pooling=False, layer_scale_init_value=0.0, num_labels=3)),
    "data2vec, both tables": ("Data2VecVisionForImageClassification", "Data2VecVisionConfig",
                              dict(use_relative_position_bias=True, num_labels=4,
                                   use_shared_relative_position_bias=True)),
    "beit, no head": ("BeitModel", "BeitConfig", dict(use_relative_position_bias=True)),
    "data2vec, no head, class token": ("Data2VecVisionModel", "Data2VecVisionConfig",
                                       dict(use_relative_position_bias=True,
                                            use_mean_pooling=False)),
}  # fmt: skip


def _source(kind: str):
    model_class, config_class, options = KINDS[kind]
    config = getattr(transformers, config_class)(**SMALL, **options)
    torch.manual_seed(0)
    return randomize(getattr(transformers, model_class)(config)), config


def _outputs(ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> tuple:
    """Logits, or without a head the pooled features (mean pooling) or the final tokens."""
    out = theirs(pixel_values=x)
    if getattr(out, "logits", None) is not None:
        return ours(x), out.logits
    if out.pooler_output is not None:
        return ours.forward_head(ours.forward_features(x), pre_logits=True), out.pooler_output
    return ours.forward_features(x), out.last_hidden_state


@requires_transformers
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_and_a_module_state_dict_give_transformers_outputs(tmp_path, kind):
    source, config = _source(kind)
    source.save_pretrained(tmp_path)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    for model in (
        vitkit.load_pretrained(tmp_path),
        vitkit.load_pretrained(source.state_dict(), hf_config=config),
    ):
        assert type(model).__name__ == "Beit" and model.config.norm_eps == 1e-12
        with torch.no_grad():
            ours, theirs = _outputs(model, source, x)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@requires_transformers
def test_the_keys_tell_a_beit_from_a_vits():
    small = dict(SMALL, hidden_size=32)
    for kind in KINDS:
        source, _ = _source(kind)
        assert reading_family("hf", list(source.state_dict())).architectures == ("beit",)
    for name in ("ViTModel", "Dinov2Model", "DeiTModel"):
        config = getattr(transformers, name.replace("Model", "Config"))(**small)
        keys = list(getattr(transformers, name)(config).state_dict())
        assert reading_family("hf", keys).architectures == ("vit",)


@requires_transformers
def test_what_a_faithful_copy_cannot_be_is_refused_in_one_line(tmp_path, capsys):
    source, config = _source("beit, per-block tables")
    bad = {**config.to_dict(), "hidden_act": "gelu_new"}
    with pytest.raises(CheckpointError, match="^hidden_act 'gelu_new': timm's and vitkit's BEiT"):
        vitkit.load_pretrained(source.state_dict(), hf_config=bad)
    extra = {**source.state_dict(), "beit.encoder.layer.0.attention.extra": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"^Hugging Face weights not understood: beit\.enc"):
        vitkit.load_pretrained(extra, hf_config=config)
    source.save_pretrained(tmp_path / "hf")
    out = tmp_path / "b.safetensors"
    assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), str(out)]) == 0
    parity = capsys.readouterr().out.splitlines()[-1]
    assert parity.startswith("parity vs transformers BeitForImageClassification: ")
    assert "(ok," in parity
    argv = ["export", "--checkpoint", str(out), "--format", "hf", str(tmp_path / "back")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "reads Hugging Face BEiT folders but does not write them" in err
    assert err.count("\n") == 1 and not (tmp_path / "back").exists()
    # transformers' norms have epsilon 1e-12, timm's Beit 1e-6: no timm folder is the same model
    argv = ["export", "--checkpoint", str(out), "--format", "timm", str(tmp_path / "timm")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "timm's Beit has LayerNorm epsilon 1e-06, this model 1e-12" in err
    assert err.count("\n") == 1 and not (tmp_path / "timm").exists()
