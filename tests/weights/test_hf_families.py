"""Hugging Face DINOv2 (with and without registers, MLP and SwiGLU), CLIP vision and SigLIP
vision weights: transformers' model run beside the converted vitkit model on the same input,
its tokens, pooled output and logits equal within `TOL` (1e-5 absolute plus 1e-5 relative),
from a state dict and from a `save_pretrained` folder; and what is refused, in one line."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from _helpers import optional_import, requires_transformers
from vitkit import CheckpointError, convert
from vitkit.weights.families import reader

transformers = optional_import("transformers")
pytestmark = requires_transformers  # every test here runs transformers

SMALL = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def scrambled(model: torch.nn.Module) -> torch.nn.Module:
    """`randomize`, then norms and layer scales far from 1 / 0, so that a norm or a scale in
    the wrong place changes the outputs by much more than the tolerance."""
    randomize(model)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lambda1") or (param.ndim == 1 and "norm" in name):
                low = -0.5 if name.endswith("bias") else 0.5
                param.copy_(torch.rand(param.shape, generator=gen) + low)
    return model.eval()


def load(source, how, tmp_path, **options):
    """The vitkit model of an HF model: from its state dict (with its config), or from the
    folder `save_pretrained` writes (Hub file names, config.json beside them)."""
    if how == "state_dict":
        return vitkit.load_pretrained(source.state_dict(), hf_config=source.config, **options)
    source.save_pretrained(tmp_path)
    return vitkit.load_pretrained(tmp_path, **options)


def check_parity(model, tokens, pooled, x):
    with torch.no_grad():
        features = model.forward_features(x)
        torch.testing.assert_close(features, tokens, **TOL)
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), pooled, **TOL)


DINOV2 = {
    "plain": (transformers.Dinov2Model, dict(mlp_ratio=2)),
    "registers": (transformers.Dinov2WithRegistersModel, dict(mlp_ratio=2, num_register_tokens=2)),
    "registers_swiglu": (
        transformers.Dinov2WithRegistersModel,
        dict(mlp_ratio=2, num_register_tokens=2, use_swiglu_ffn=True),
    ),
}


@pytest.mark.parametrize("how", ["state_dict", "folder"])
@pytest.mark.parametrize("variant", list(DINOV2))
def test_dinov2_parity(variant, how, tmp_path):
    """last_hidden_state = forward_features, pooler_output (the normed class token) = the
    pooled features = model(x) (no head); registers sit between class token and patches."""
    cls, extra = DINOV2[variant]
    config_cls = transformers.Dinov2WithRegistersConfig if "registers" in variant else None
    config = (config_cls or transformers.Dinov2Config)(**SMALL, **extra)
    source = scrambled(cls(config))
    model = load(source, how, tmp_path)
    cfg = model.config
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.img_size) == (64, 2, 4, 32)
    assert cfg.init_values is not None and cfg.norm_eps == 1e-6 and cfg.global_pool == "token"
    assert cfg.reg_tokens == (2 if "registers" in variant else 0)
    assert cfg.no_embed_class == ("registers" in variant)
    swiglu = {"state_dict": "swiglu", "folder": "swiglu_packed"}[how]  # split / packed (Hub)
    assert cfg.mlp_layer == (swiglu if "swiglu" in variant else "mlp")
    assert cfg.act_layer == ("silu" if "swiglu" in variant else "gelu")
    x = images(32, batch=2)
    with torch.no_grad():
        out = source(pixel_values=x)
        torch.testing.assert_close(model(x), out.pooler_output, **TOL)
    check_parity(model, out.last_hidden_state, out.pooler_output, x)


@pytest.mark.parametrize("how", ["state_dict", "folder"])
@pytest.mark.parametrize("projection", [False, True])
def test_clip_vision_parity(projection, how, tmp_path):
    """last_hidden_state (no final norm) = forward_features; pooler_output
    (post_layernorm on the class token, vitkit's fc_norm) = the pooled features; with the
    visual projection, image_embeds = model(x)."""
    config = transformers.CLIPVisionConfig(**SMALL, intermediate_size=128, projection_dim=16)
    cls = transformers.CLIPVisionModelWithProjection if projection else transformers.CLIPVisionModel
    source = scrambled(cls(config))
    model = load(source, how, tmp_path)
    cfg = model.config
    assert cfg.pre_norm and not cfg.patch_bias and cfg.use_fc_norm and cfg.global_pool == "token"
    assert cfg.act_layer == "quick_gelu" and cfg.norm_eps == 1e-5
    assert cfg.num_classes == (16 if projection else 0)
    x = images(32, batch=2)
    with torch.no_grad():
        out = source(pixel_values=x)
        tower = source.vision_model(pixel_values=x) if projection else out
        expected = out.image_embeds if projection else out.pooler_output
        torch.testing.assert_close(model(x), expected, **TOL)
    check_parity(model, out.last_hidden_state, tower.pooler_output, x)


@pytest.mark.parametrize("how", ["state_dict", "folder"])
def test_siglip_vision_parity(how, tmp_path):
    """last_hidden_state (after post_layernorm, vitkit's final norm) = forward_features;
    pooler_output (the attention-pooling head) = global_pool='map' = model(x)."""
    config = transformers.SiglipVisionConfig(**SMALL, intermediate_size=128)
    source = scrambled(transformers.SiglipVisionModel(config))
    model = load(source, how, tmp_path)
    cfg = model.config
    assert cfg.global_pool == "map" and not cfg.class_token and cfg.act_layer == "gelu_tanh"
    assert cfg.num_classes == 0 and cfg.norm_eps == 1e-6
    x = images(32, batch=2)
    with torch.no_grad():
        out = source(pixel_values=x)
        torch.testing.assert_close(model(x), out.pooler_output, **TOL)
    check_parity(model, out.last_hidden_state, out.pooler_output, x)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_image_classification_heads(family):
    """CLIPForImageClassification averages the patch tokens before post_layernorm (vitkit:
    'avg', no final norm); SiglipForImageClassification averages every token after it (the
    attention-pool head unused): logits equal."""
    if family == "clip":
        config = transformers.CLIPConfig(
            vision_config=dict(**SMALL, intermediate_size=128), text_config=TEXT, num_labels=3
        )
        source = scrambled(transformers.CLIPForImageClassification(config))
    else:
        config = transformers.SiglipConfig(
            vision_config=dict(**SMALL, intermediate_size=128), text_config=TEXT, num_labels=3
        )
        source = scrambled(transformers.SiglipForImageClassification(config))
    model = vitkit.load_pretrained(source.state_dict(), hf_config=config)
    assert model.config.global_pool == "avg" and model.config.num_classes == 3
    assert model.config.final_norm == (family == "siglip")
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).logits, **TOL)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_two_tower_checkpoint_loads_its_vision_tower(family, tmp_path, caplog):
    """A CLIPModel / SiglipModel folder: the text tower is dropped (logged), the image
    features (get_image_features: CLIP's projected, SigLIP's pooled) = model(x)."""
    vision = dict(**SMALL, intermediate_size=128)
    if family == "clip":
        config = transformers.CLIPConfig(vision_config=vision, text_config=TEXT, projection_dim=16)
        source = scrambled(transformers.CLIPModel(config))
    else:
        config = transformers.SiglipConfig(vision_config=vision, text_config=TEXT)
        source = scrambled(transformers.SiglipModel(config))
    source.save_pretrained(tmp_path)
    with caplog.at_level("INFO", logger="vitkit.weights.vit.hf_families"):
        model = vitkit.load_pretrained(tmp_path)
    assert "loading the vision tower, dropped" in caplog.text
    x = images(32, batch=2)
    with torch.no_grad():
        features = source.get_image_features(pixel_values=x)
        features = getattr(features, "pooler_output", features)
        torch.testing.assert_close(model(x), features, **TOL)


def test_dinov2_classifier_is_refused_or_replaced(tmp_path):
    """Dinov2ForImageClassification's head reads [class token, mean patch token]: refused
    by name; with num_classes= (as `vitkit train --pretrained` passes) the backbone loads
    under a new head."""
    config = transformers.Dinov2Config(**SMALL, mlp_ratio=2, num_labels=3)
    source = scrambled(transformers.Dinov2ForImageClassification(config))
    source.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"^Dinov2ForImageClassification's classifier .*"
                       r"\(128 inputs\).*num_classes=N") as err:  # fmt: skip
        vitkit.load_pretrained(tmp_path)
    assert "\n" not in str(err.value)
    model = vitkit.load_pretrained(tmp_path, num_classes=7)
    x = images(32, batch=2)
    assert model(x).shape == (2, 7)
    with torch.no_grad():
        expected = source.dinov2(pixel_values=x).last_hidden_state
        torch.testing.assert_close(model.forward_features(x), expected, **TOL)


@pytest.mark.parametrize(
    ("cls", "config_cls", "mode"),
    [
        ("Dinov2Model", "Dinov2Config", "hf"),  # bicubic
        ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", "timm"),  # antialiased
        ("CLIPVisionModel", "CLIPVisionConfig", "hf"),
    ],
)
def test_new_resolution_equals_hf_interpolation(cls, config_cls, mode):
    """Loaded at 48 px, the resampled position grid equals HF's own interpolation at 48 px."""
    extra = dict(mlp_ratio=2) if "Dinov2" in cls else dict(intermediate_size=128)
    config = getattr(transformers, config_cls)(**SMALL, **extra)
    source = scrambled(getattr(transformers, cls)(config))
    model = vitkit.load_pretrained(
        source.state_dict(), hf_config=config, img_size=48, pos_resample=mode
    )
    options = {} if "Dinov2" in cls else {"interpolate_pos_encoding": True}
    x = images(48, batch=2)
    with torch.no_grad():
        expected = source(pixel_values=x, **options).last_hidden_state
        torch.testing.assert_close(model.forward_features(x), expected, **TOL)


def test_without_config_hf_defaults_hold(caplog):
    """A bare CLIP state dict: HF's defaults (quick_gelu, eps 1e-5) are assumed and logged;
    the heads of a non-standard width must be given."""
    config = transformers.CLIPVisionConfig(**SMALL, intermediate_size=128)
    source = scrambled(transformers.CLIPVisionModel(config))
    with pytest.raises(CheckpointError, match=r"width 64 is not a standard ViT size"):
        vitkit.load_pretrained(source.state_dict())
    with caplog.at_level("INFO", logger="vitkit.weights.vit.hf_families"):
        model = vitkit.load_pretrained(source.state_dict(), num_heads=4)
    assert "assuming hidden_act 'quick_gelu' and layer_norm_eps 1e-05" in caplog.text
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(pixel_values=x).pooler_output, **TOL)


def test_a_swapped_norm_is_seen():
    """The parity is sensitive: CLIP's pre- and post-norms exchanged change the output."""
    config = transformers.CLIPVisionConfig(**SMALL, intermediate_size=128)
    source = scrambled(transformers.CLIPVisionModel(config))
    sd = dict(source.state_dict())
    for kind in ("weight", "bias"):
        pre, post = f"pre_layrnorm.{kind}", f"post_layernorm.{kind}"
        sd[pre], sd[post] = sd[post], sd[pre]
    model = vitkit.load_pretrained(sd, hf_config=config)
    x = images(32, batch=2)
    with torch.no_grad():
        diff = (model(x) - source(pixel_values=x).pooler_output).abs().max().item()
    assert diff > 1e-2


def test_wrong_hidden_act_is_one_line_naming_it():
    config = transformers.SiglipVisionConfig(**SMALL, intermediate_size=128)
    source = transformers.SiglipVisionModel(config)
    bad = {**config.to_dict(), "hidden_act": "relu"}
    message = r"^the Hugging Face siglip model uses hidden_act='relu', which vitkit's MLP does "
    with pytest.raises(CheckpointError, match=message + r"not have; it has gelu, ") as err:
        vitkit.load_pretrained(source.state_dict(), hf_config=bad)
    assert "\n" not in str(err.value)


def test_unknown_key_is_one_line_naming_it():
    config = transformers.Dinov2Config(**SMALL, mlp_ratio=2)
    sd = dict(transformers.Dinov2Model(config).state_dict())
    sd["encoder.layer.0.attention.rel_pos_bias"] = torch.zeros(4)
    message = r"^Hugging Face weights not understood: encoder\.layer\.0\.attention\.rel_pos_bias; "
    with pytest.raises(CheckpointError, match=message + "only Dinov2Model") as err:
        vitkit.load_pretrained(sd, hf_config=config)
    assert "\n" not in str(err.value)


def test_detection_and_the_processor_data_config(tmp_path):
    """CLIP / SigLIP keys are Hugging Face weights; a folder's preprocessor_config.json gives
    the data config (CLIPImageProcessor: shortest edge 40, centre crop 32, CLIP statistics)."""
    assert convert.detect_format({"vision_model.embeddings.patch_embedding.weight": 0}) == "hf"
    assert convert.detect_format({"embeddings.patch_embedding.weight": 0}) == "hf"
    assert convert.CONVERTERS["hf"] is reader("hf")  # one 'hf' format for every family
    config = transformers.CLIPVisionConfig(**SMALL, intermediate_size=128)
    transformers.CLIPVisionModel(config).save_pretrained(tmp_path)
    processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}
    )
    processor.save_pretrained(tmp_path)
    data = vitkit.load_pretrained(tmp_path).data_config
    assert data.input_size == (3, 32, 32) and data.crop_pct == 32 / 40
    assert data.crop_mode == "center" and data.interpolation == "bicubic"
    assert data.mean == tuple(processor.image_mean) and data.std == tuple(processor.image_std)


def test_train_fine_tunes_from_a_dinov2_classifier_folder(tmp_path, capsys):
    """`vitkit train --pretrained DIR` on a Dinov2WithRegistersForImageClassification folder:
    the backbone loads under a new head for the data's classes, the patch grid is resampled
    (the registers have no positions) and the processor's statistics are the run's."""
    import numpy as np
    from PIL import Image

    from vitkit import cli

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (data / name).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(data / name / f"{i}.png")
    config = transformers.Dinov2WithRegistersConfig(
        **SMALL, mlp_ratio=2, num_register_tokens=2, num_labels=5
    )
    transformers.Dinov2WithRegistersForImageClassification(config).save_pretrained(tmp_path / "hf")
    processor = transformers.BitImageProcessor(
        size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}
    )
    processor.save_pretrained(tmp_path / "hf")
    argv = ["train", "--pretrained", str(tmp_path / "hf"), "--data", str(data)]
    argv += ["--img-size", "48", "--epochs", "1", "--batch-size", "8", "--no-progress"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    model = vitkit.load(tmp_path / "run" / "model.safetensors")
    assert (model.config.num_classes, model.config.reg_tokens) == (3, 2)
    assert model.pos_embed.shape == (1, 6 * 6, 64)  # the 4x4 patch grid resampled to 6x6
    assert model.data_config.mean == tuple(processor.image_mean)


CONVERT_PARITY = {  # family -> (transformers class, the outputs compared)
    "dinov2": ("Dinov2WithRegistersModel", "tokens and pooled features"),
    "clip": ("CLIPModel", "logits, tokens and pooled features"),
    "siglip": ("SiglipVisionModel", "tokens and pooled features"),
}


@pytest.mark.parametrize("family", list(CONVERT_PARITY))
def test_convert_command_checks_parity_against_transformers(family, tmp_path, capsys):
    """`vitkit convert --from hf DIR` runs the model the folder's config.json names, read by
    transformers' own `from_pretrained`: DINOv2 with registers and SwiGLU, a two-tower
    CLIPModel (its image features), SigLIP's MAP head. A head count other than the config's
    makes another function: a mismatch, exit 1."""
    from vitkit import cli

    vision = dict(**SMALL, intermediate_size=128)
    if family == "dinov2":
        config = transformers.Dinov2WithRegistersConfig(
            **SMALL, mlp_ratio=2, num_register_tokens=2, use_swiglu_ffn=True
        )
        source = transformers.Dinov2WithRegistersModel(config)
    elif family == "clip":
        config = transformers.CLIPConfig(vision_config=vision, text_config=TEXT, projection_dim=16)
        source = transformers.CLIPModel(config)
    else:
        source = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision))
    scrambled(source).save_pretrained(tmp_path / "hf")
    argv = ["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "vit.safetensors")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    name, compared = CONVERT_PARITY[family]
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"parity vs transformers {name}: max |difference| "), line
    assert line.endswith(f" over the {compared} of a random batch of 2 (ok, tolerance 1e-04)")
    assert float(line.split("max |difference| ")[1].split()[0]) <= 1e-4
    assert (tmp_path / "vit.safetensors").is_file()
    assert cli.main([*argv, "--num-heads", "2"]) == 1  # the config says 4
    assert capsys.readouterr().out.splitlines()[-1].endswith("(MISMATCH, tolerance 1e-04)")
