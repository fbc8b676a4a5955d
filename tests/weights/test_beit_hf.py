"""Hugging Face's BEiT and Data2Vec vision models (`BeitModel`, `BeitForImageClassification`,
`Data2VecVisionModel`, `Data2VecVisionForImageClassification`): folders written by
`save_pretrained` (the Hub file layout) and transformers 5's module state dicts load as vitkit
BEiTs with transformers' outputs within 1e-5; their keys are told from a ViT's; what a faithful
copy cannot be is refused in one line.

And written (weights/beit/folders.py): `vitkit export --format hf` of a BEiT is a folder
`BeitForImageClassification` / `BeitModel.from_pretrained` loads with vitkit's outputs within
1e-5 and that vitkit reads back as the same model; what Hugging Face's Beit cannot express
(an oblong grid, no query / value bias, pooling other than its two) is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

import vitkit
from _helpers import optional_import, randomize, relative_error, requires_transformers
from vitkit import CheckpointError, cli
from vitkit.data.data_config import DataConfig
from vitkit.weights.beit.folders import save_hf_beit_folder
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
    # transformers' norms have epsilon 1e-12, timm's Beit 1e-6: no timm folder is the same model
    argv = ["export", "--checkpoint", str(out), "--format", "timm", str(tmp_path / "timm")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "timm's Beit has LayerNorm epsilon 1e-06, this model 1e-12" in err
    assert err.count("\n") == 1 and not (tmp_path / "timm").exists()


# -- written: a BEiT as transformers' BeitForImageClassification / BeitModel folder -----------

NAMES = ["cat", "dog", "eel"]
# vitkit BEiTs Hugging Face's Beit expresses: every kind of position, pooling and head.
WRITTEN = {
    "per-block tables, mean pooling": dict(),
    "shared table, positions, class token, no LayerScale": dict(
        use_rel_pos_bias=False, use_shared_rel_pos_bias=True, use_abs_pos_emb=True,
        global_pool="token", init_values=None, norm_eps=1e-12),
    "both tables, no head": dict(num_classes=0, use_shared_rel_pos_bias=True),
}  # fmt: skip


def _vitkit_beit(tmp_path, **options):
    """A random vitkit BEiT saved with class names and a data config."""
    options = {"num_classes": 3, **options}
    model = vitkit.create_model("beit_base_patch16_224", embed_dim=64, depth=2, num_heads=2,
                                img_size=32, patch_size=8, **options)  # fmt: skip
    randomize(model)
    model.data_config = DataConfig(input_size=(3, 32, 32), mean=(0.4, 0.5, 0.6), std=0.25,
                                   crop_pct=0.8)  # fmt: skip
    names = NAMES[: model.config.num_classes]
    vitkit.save(model, tmp_path / "beit.safetensors", meta={"class_names": names})
    return model, tmp_path / "beit.safetensors"


@requires_transformers
@pytest.mark.parametrize("kind", WRITTEN)
def test_transformers_loads_the_hf_folder_of_a_beit(tmp_path, capsys, kind):
    model, checkpoint = _vitkit_beit(tmp_path, **WRITTEN[kind])
    out = tmp_path / "hf"
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--format", "hf", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}/ (hf folder")
    head = model.config.num_classes > 0
    model_class = transformers.BeitForImageClassification if head else transformers.BeitModel
    theirs, info = model_class.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # every key written is one transformers expects
    assert theirs.config.id2label == dict(enumerate(NAMES[: model.config.num_classes]))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, expected = _outputs(model, theirs.eval(), x)
        assert relative_error(ours, expected) < 1e-5
    processor = json.loads((out / "preprocessor_config.json").read_text())["pretrained_cfg"]
    assert DataConfig.from_dict(processor, "test") == model.data_config
    back = vitkit.load_pretrained(out)
    same = model.config.replace(use_fc_norm=model.config.fc_norm)  # the default, stated
    assert back.config == same and back.data_config == model.data_config
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)


@requires_transformers
def test_a_transformers_beit_read_and_written_back_gives_its_outputs(tmp_path):
    source, _ = _source("beit, shared table, positions, class token")
    source.save_pretrained(tmp_path / "source")
    save_hf_beit_folder(vitkit.load_pretrained(tmp_path / "source"), tmp_path / "back")
    back = transformers.BeitForImageClassification.from_pretrained(tmp_path / "back").eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(back(x).logits, source(x).logits) < 1e-5


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(qkv_bias=False), "qkv_bias=False (HF's query and value always have a bias); "
         "export --format timm instead"),
        (dict(global_pool="avg", use_fc_norm=False),
         "global_pool='avg' without fc_norm (HF's mean pooling norms the mean)"),
        (dict(global_pool="none"), "global_pool='none' (HF pools the mean or the class token)"),
        (dict(img_size=(32, 48), norm_eps=1e-5),
         "an oblong patch grid 4x6 (HF resamples its position tables as square); export "
         "--format onnx"),
    ],
    ids=["no-qkv-bias", "mean-without-norm", "no-pooling", "oblong"],
)  # fmt: skip
def test_what_hugging_faces_beit_cannot_express_is_refused_before_writing(
    tmp_path, options, message
):
    model = vitkit.create_model("beit_base_patch16_224", embed_dim=64, depth=2, num_heads=2,
                                patch_size=8, **{"img_size": 32, **options})  # fmt: skip
    with pytest.raises(ValueError) as err:
        save_hf_beit_folder(model, tmp_path / "hf")
    assert str(err.value).startswith("Hugging Face's Beit cannot express ")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "hf").exists()
