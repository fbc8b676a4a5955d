"""Hugging Face converter: parity with transformers' ViT, round trips in both key layouts, and
what Hugging Face cannot express."""

from __future__ import annotations

import re

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError, VisionTransformer, convert


def hf_config(**kw):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    base = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    return transformers.ViTConfig(**{**base, **kw})


# One block's names: transformers 4 (and every Hub file) -> transformers 5's modules, written
# here from the two libraries' sources, not from the converter's tables.
_V4_TO_V5 = [
    (r"\.encoder\.layer\.(\d+)\.", r".layers.\1."),
    (r"\.attention\.attention\.query\.", ".attention.q_proj."),
    (r"\.attention\.attention\.key\.", ".attention.k_proj."),
    (r"\.attention\.attention\.value\.", ".attention.v_proj."),
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"(\.\d+)\.output\.dense\.", r"\1.mlp.fc2."),
]  # fmt: skip
_V5_TO_V4 = [
    (r"\.layers\.(\d+)\.", r".encoder.layer.\1."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]  # fmt: skip


def in_layout(state_dict: dict, layout: str) -> dict:
    """An HF ViT state dict with its keys in transformers 4's names ('transformers-4':
    `encoder.layer.N.attention.attention.query`) or transformers 5's ('transformers-5':
    `layers.N.attention.q_proj`), whichever the installed transformers gave."""
    rules = _V5_TO_V4 if layout == "transformers-4" else _V4_TO_V5
    out = {}
    for key, value in state_dict.items():
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


@pytest.mark.parametrize("layout", ["transformers-4", "transformers-5"])
def test_hf_parity_with_config(layout):
    """Both key layouts give HF's outputs: transformers 4's (the Hub's files) and 5's."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config()
    source = randomize(transformers.ViTForImageClassification(cfg))
    weights = in_layout(source.state_dict(), layout)
    qkv = {"transformers-4": "attention.attention.query", "transformers-5": "attention.q_proj"}
    assert (
        f"vit.{'encoder.layer' if layout == 'transformers-4' else 'layers'}.1.{qkv[layout]}.weight"
        in weights
        and len(weights) == len(source.state_dict())
    )
    sd, config = convert.from_hf(weights, config=cfg)
    assert (config.embed_dim, config.depth, config.num_heads, config.num_classes) == (64, 2, 4, 5)
    assert config.norm_eps == 1e-12 and config.mlp_ratio == 2.0
    model = vitkit.load_pretrained(weights, hf_config=cfg)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_hf_parity_without_config_uses_hf_defaults():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(hidden_size=192, num_attention_heads=3, intermediate_size=768, image_size=48)
    source = randomize(transformers.ViTForImageClassification(cfg))
    sd, config = convert.from_hf(source.state_dict())
    assert config.num_heads == 3 and config.norm_eps == 1e-12 and config.img_size == 48
    model = vitkit.load_pretrained(source.state_dict())
    x = images(48, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_hf_vitmodel_with_pooler_and_saved_folder(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(num_attention_heads=2, layer_norm_eps=1e-6)
    source = randomize(transformers.ViTModel(cfg))  # with the pooler: dropped on conversion
    sd, config = convert.from_hf(source.state_dict(), config=cfg)
    assert config.num_classes == 0 and config.num_heads == 2 and config.norm_eps == 1e-6
    model = vitkit.load_pretrained(source.state_dict(), hf_config=cfg)
    x = images(32, batch=2)
    with torch.no_grad():
        expected = source(pixel_values=x).last_hidden_state
        torch.testing.assert_close(model.forward_features(x), expected, **TOL)

    # A save_pretrained folder: Hub file names, config.json found beside the weights.
    classifier = randomize(transformers.ViTForImageClassification(cfg))
    classifier.save_pretrained(tmp_path)
    model = vitkit.load_pretrained(tmp_path)
    assert model.config.num_heads == 2
    with torch.no_grad():
        torch.testing.assert_close(model(x), classifier(pixel_values=x).logits, **TOL)


@pytest.mark.parametrize("layout", ["legacy", "v5"])
def test_round_trip_vitkit_hf_vitkit(layout):
    model = randomize(
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5
        )
    )
    exported = convert.to_hf(model, layout=layout)
    hf = convert.to_hf_config(model.config)
    back, config = convert.from_hf(exported, config=hf)
    assert config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(back[key], value), key


def test_the_installed_transformers_reads_the_layout_of_its_version():
    """transformers 5 reads the 'v5' layout, 4.x the 'legacy' one: the layout this
    transformers reads is loaded strictly and gives vitkit's logits (the other layout is
    checked by the round trip above only)."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    layout = "v5" if int(transformers.__version__.split(".")[0]) >= 5 else "legacy"
    model = randomize(
        VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5
        )
    )
    hf = convert.to_hf_config(model.config)
    source = transformers.ViTForImageClassification(transformers.ViTConfig(**hf)).eval()
    source.load_state_dict(convert.to_hf(model, layout=layout), strict=True)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


def test_to_hf_refuses_what_hf_cannot_express():
    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, global_pool="avg"
    )
    with pytest.raises(ValueError, match=r"needs a class token with global_pool='token'"):
        convert.to_hf(model)


def test_hf_other_activation_is_refused():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = hf_config(hidden_act="gelu_new")
    source = transformers.ViTForImageClassification(cfg)
    with pytest.raises(CheckpointError, match=r"hidden_act='gelu_new'"):
        convert.from_hf(source.state_dict(), config=cfg)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{not json", r"cannot read .*config\.json \(Expecting"),
        ("[1, 2]", r".*config\.json must hold a JSON object, not list"),
        ('{"num_attention_heads": 10000000}', r"num_heads must be in \[1, 65536\]"),
        ('{"image_size": 1000000000, "num_attention_heads": 4}', r"img_size must be in \[1, "),
        ('{"layer_norm_eps": -1, "num_attention_heads": 4}', r"norm_eps must be > 0, got -1"),
        ("{}", r"do not record the number of attention heads and width 64 is not a standard"),
    ],
    ids=["broken", "list", "heads", "image-size", "eps", "no-heads"],
)
def test_a_doctored_config_json_is_one_clear_error(tmp_path, text, pattern):
    """A folder's config.json is untrusted: broken or absurd values are refused before any
    model is built, with the file named when it cannot be read."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    transformers.ViTForImageClassification(hf_config()).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=pattern) as err:
        vitkit.load_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def test_hf_vitmae_encoder_parity():
    """A ViTMAEModel (MAE-pretrained encoder) loads as a plain ViT: with mask_ratio 0 its
    shuffled tokens, put back in order, equal vitkit's."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = transformers.ViTMAEConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8,
                                    mask_ratio=0.0)  # fmt: skip
    source = randomize(transformers.ViTMAEModel(cfg))
    model = vitkit.load_pretrained(source.state_dict(), hf_config=cfg)
    x = images(32, batch=2)
    with torch.no_grad():
        out = source(pixel_values=x)
        index = out.ids_restore[..., None].expand(-1, -1, 64)  # (B, N, D)
        patches = torch.gather(out.last_hidden_state[:, 1:], 1, index)
        ours = model.forward_features(x)
    torch.testing.assert_close(ours[:, 1:], patches, **TOL)
    torch.testing.assert_close(ours[:, 0], out.last_hidden_state[:, 0], **TOL)
