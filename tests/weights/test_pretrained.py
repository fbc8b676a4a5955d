"""`load_pretrained`: position-grid resampling, new heads, loading into a given model (as
`vitkit train --pretrained` does), and readable reports."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError, VisionTransformer


def test_resample_224_to_384_matches_timm():
    timm = pytest.importorskip("timm", reason="timm not installed")
    from timm.layers import resample_abs_pos_embed
    from timm.models.vision_transformer import checkpoint_filter_fn

    source = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    sd = source.state_dict()
    model = vitkit.load_pretrained(sd, img_size=384)
    expected = resample_abs_pos_embed(sd["pos_embed"], new_size=(24, 24), num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, **TOL)
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)

    big = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=384).eval()
    big.load_state_dict(checkpoint_filter_fn(sd, big))
    x = images(384)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, 1000)
        torch.testing.assert_close(out, big(x), **TOL)


def test_new_num_classes_reinitialises_only_the_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    model = vitkit.load_pretrained(source.state_dict(), num_classes=7, num_heads=4)
    assert model.head.weight.shape == (7, 64)
    assert model.config.num_classes == 7
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            assert torch.equal(model.state_dict()[key], value), key


def test_load_into_given_model_with_other_head():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    )
    target = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=3
    )
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    assert model is target and model.head.weight.shape == (3, 64)
    assert torch.equal(model.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)


def test_load_into_given_model_at_another_resolution():
    source = randomize(
        VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4)
    )
    target = VisionTransformer(img_size=(48, 64), patch_size=8, embed_dim=64, depth=1, num_heads=4)
    model = vitkit.load_pretrained(source.state_dict(), model=target)
    expected = vitkit.model.layers.pos_embed.resample_pos_embed(source.pos_embed, new_size=(6, 8))
    assert torch.equal(model.pos_embed.detach(), expected.detach())
    assert model(images((48, 64))).shape == (1, 1000)
    with pytest.raises(ValueError, match=r"img_size= applies when load_pretrained builds"):
        vitkit.load_pretrained(source.state_dict(), model=target, img_size=64)


def test_load_into_wrong_model_gives_readable_report():
    source = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    target = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=4)
    with pytest.raises(CheckpointError, match=r"missing: blocks\.2\.attn\.proj\.bias"):
        vitkit.load_pretrained(source.state_dict(), model=target)


# -- `vitkit train --pretrained PATH`: load_pretrained(path, model=model) --------------------

ARCH = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)


def write_source(kind: str, num_classes: int, path) -> dict[str, torch.Tensor]:
    """Write pretrained weights of ARCH with `num_classes` classes to `path`, in vitkit's format
    (safetensors with the config), in timm's layout exported by vitkit, or from timm's own
    model; return the source's state dict."""
    if kind == "timm":
        timm = pytest.importorskip("timm", reason="timm not installed")
        source = timm.models.vision_transformer.VisionTransformer(**ARCH, num_classes=num_classes)
    else:
        source = VisionTransformer(**ARCH, num_classes=num_classes)
    randomize(source)
    if kind == "vitkit":
        vitkit.save(source, path)
    elif kind == "timm-export":
        torch.save(vitkit.convert.to_timm(source), path)
    else:
        torch.save(source.state_dict(), path)
    return source.state_dict()


@pytest.mark.parametrize("source_classes", [5, 10])
@pytest.mark.parametrize(
    "kind, name",
    [
        ("vitkit", "pretrained.safetensors"),
        ("timm-export", "pretrained.pth"),
        ("timm", "timm.pth"),
    ],
)
def test_load_pretrained_file_into_fresh_model(tmp_path, kind, name, source_classes):
    path = tmp_path / name
    source = write_source(kind, source_classes, path)
    model = VisionTransformer(**ARCH, num_classes=10)
    own_head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("head.")}

    loaded = vitkit.load_pretrained(path, model=model)

    assert loaded is model
    state = model.state_dict()
    assert state.keys() == source.keys()
    for key, value in source.items():
        if not key.startswith("head."):
            assert torch.equal(state[key], value), key
    assert model.head.weight.shape == (10, 64) and model.head.bias.shape == (10,)
    assert model.config.num_classes == 10
    for key in ("head.weight", "head.bias"):
        expected = source[key] if source_classes == 10 else own_head[key]
        assert torch.equal(state[key], expected), key
    x = images(32, batch=2)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()


def test_load_pretrained_across_encoder_layouts(tmp_path):
    source = randomize(VisionTransformer(**ARCH, num_classes=5))
    vitkit.save(source, tmp_path / "native.safetensors")
    torch_model = VisionTransformer(**ARCH, num_classes=5, encoder="torch")
    vitkit.load_pretrained(tmp_path / "native.safetensors", model=torch_model)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(torch_model(x), source(x), **TOL)

    vitkit.save(torch_model, tmp_path / "torch.safetensors")  # its keys: blocks.layers.N...
    native = vitkit.load_pretrained(
        tmp_path / "torch.safetensors", model=VisionTransformer(**ARCH, num_classes=3)
    )
    for key, value in source.state_dict().items():
        if not key.startswith("head."):
            assert torch.equal(native.state_dict()[key], value), key

    scaled = randomize(VisionTransformer(**ARCH, init_values=1e-5))
    with pytest.raises(CheckpointError, match=r"ls1\.gamma'?, which the model's encoder='torch'"):
        vitkit.load_pretrained(scaled.state_dict(), model=torch_model)


def test_patch_embedding_pi_resize_matches_timm():
    timm = pytest.importorskip("timm", reason="timm not installed")
    from vitkit.model.layers.pos_embed import resample_patch_embed

    weight = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    for new_size in [(8, 8), (32, 32), (14, 14), (16, 8)]:
        expected = timm.layers.resample_patch_embed(weight, list(new_size))
        torch.testing.assert_close(
            resample_patch_embed(weight, new_size), expected, atol=1e-4, rtol=1e-4
        )


def test_load_into_a_model_with_another_patch_size():
    """FlexiViT's promise: a patch resized with the patch size gives the old token (one patch
    per image here, as the resize is the per-patch one)."""
    source = randomize(VisionTransformer(img_size=8, patch_size=8, embed_dim=64, depth=1,
                                         num_heads=4))  # fmt: skip
    target = VisionTransformer(img_size=16, patch_size=16, embed_dim=64, depth=1, num_heads=4)
    vitkit.load_pretrained(source.state_dict(), model=target)
    x = images(8)
    bigger = torch.nn.functional.interpolate(x, size=(16, 16), mode="bicubic", antialias=True)
    with torch.no_grad():
        torch.testing.assert_close(
            target.patch_embed(bigger), source.patch_embed(x), atol=1e-4, rtol=1e-4
        )


def test_position_grid_resampling_as_hugging_face_and_torchvision_do():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    from torchvision.models.vision_transformer import interpolate_embeddings
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    source = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1,
                                         num_heads=4))  # fmt: skip
    pos = source.pos_embed.detach()
    hf = ViTEmbeddings(transformers.ViTConfig(hidden_size=64, image_size=32, patch_size=8))
    hf.position_embeddings.data.copy_(pos)
    with torch.no_grad():
        expected = hf.interpolate_pos_encoding(torch.zeros(1, 1 + 36, 64), 48, 48)
    model = vitkit.load_pretrained(source.state_dict(), img_size=48, pos_resample="hf", num_heads=4)
    torch.testing.assert_close(model.pos_embed.detach(), expected, **TOL)

    state = {"encoder.pos_embedding": pos}
    expected = interpolate_embeddings(48, 8, state)["encoder.pos_embedding"]
    model = vitkit.load_pretrained(
        source.state_dict(), img_size=48, pos_resample="torchvision", num_heads=4
    )
    torch.testing.assert_close(model.pos_embed.detach(), expected, **TOL)
    with pytest.raises(ValueError, match="unknown pos_resample 'jax'; expected one of timm"):
        vitkit.load_pretrained(source.state_dict(), img_size=48, pos_resample="jax", num_heads=4)


def test_no_embed_class_weights_resample_to_another_size_as_timm():
    """DeiT III keeps its class token off the position grid (no_embed_class): the grid alone
    is resampled, as timm's checkpoint_filter_fn does."""
    timm = pytest.importorskip("timm", reason="timm not installed")
    from timm.models.vision_transformer import checkpoint_filter_fn

    options = dict(pretrained=False, depth=2, img_size=32, patch_size=8)
    source = randomize(timm.create_model("deit3_small_patch16_224", **options))
    model = vitkit.load_pretrained(source.state_dict(), img_size=48, arch="deit3_small_patch16_224")
    big = timm.create_model("deit3_small_patch16_224", **{**options, "img_size": 48}).eval()
    big.load_state_dict(checkpoint_filter_fn(source.state_dict(), big))
    x = images(48, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), big(x), **TOL)


def test_a_distillation_token_is_added_to_weights_without_one():
    """Fine-tuning with a teacher from weights trained without a distillation token: the token
    starts as the class token with its position, its head is new, and the patch positions are
    the checkpoint's; a class-token-less checkpoint is refused in one line."""
    source = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    model = vitkit.load_pretrained(source.state_dict(), num_classes=5, distilled=True, num_heads=4)
    assert model.config.distilled and model.config.num_classes == 5
    torch.testing.assert_close(model.dist_token, source.cls_token, rtol=0, atol=0)
    pos = model.pos_embed
    assert pos.shape == (1, 2 + 16, 64)
    torch.testing.assert_close(pos[:, 1], source.pos_embed[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(pos[:, 2:], source.pos_embed[:, 1:], rtol=0, atol=0)
    cls_logits, dist_logits = model.forward_distill(torch.randn(2, 3, 32, 32))
    assert cls_logits.shape == dist_logits.shape == (2, 5)
    pooled = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4,
                               class_token=False, global_pool="avg")  # fmt: skip
    with pytest.raises(Exception, match="needs global_pool='token'|needs a class token"):
        vitkit.load_pretrained(pooled.state_dict(), num_classes=5, distilled=True, num_heads=4)


def test_the_three_kinds_of_options(tmp_path, caplog):
    """Reading options (what the weights do not record), fitting options (the new model's
    sizes) and ViTConfig fields of the new model, each where it belongs; a name of none of
    them is refused before the file is read."""
    import logging

    caplog.set_level(logging.INFO)
    source = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2,
                                         num_heads=4, num_classes=10))  # fmt: skip
    torch.save(source.state_dict(), tmp_path / "w.pth")
    model = vitkit.load_pretrained(tmp_path / "w.pth", num_classes=5, img_size=48,
                                   num_heads=4, drop_path_rate=0.1)  # fmt: skip
    config = model.config
    assert (config.num_heads, config.num_classes, config.img_size) == (4, 5, 48)
    assert config.drop_path_rate == 0.1 and model.data_config.input_size == (3, 48, 48)
    assert any(m.startswith(f"{tmp_path / 'w.pth'} states no data config; assuming the timm")
               for m in caplog.messages)  # fmt: skip
    with pytest.raises(TypeError, match=r"unknown option\(s\) config, depthh; it takes"):
        vitkit.load_pretrained(tmp_path / "nope.pth", num_heads=4, depthh=3, config={})
