"""torchvision converter: parity with torchvision's ViT and the unsupported representation
layer, and `vitkit convert --from torchvision`'s check against the builder of the weights."""

from __future__ import annotations

import pytest
import torch
from _parity import TOL, images, randomize

import vitkit
from vitkit import CheckpointError, convert
from vitkit.weights.vit.reference import source_model


def test_torchvision_small_parity():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    source = randomize(
        TVViT(
            image_size=32,
            patch_size=8,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=256,
            num_classes=7,
        )
    )
    sd, config = convert.from_torchvision(source.state_dict(), num_heads=4)
    assert (config.embed_dim, config.depth, config.num_classes, config.patch_size) == (64, 2, 7, 8)
    model = vitkit.load_pretrained(source.state_dict(), num_heads=4)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


@pytest.mark.slow
def test_torchvision_vit_b_16_parity():
    torchvision = pytest.importorskip("torchvision", reason="torchvision not installed")
    source = randomize(torchvision.models.vit_b_16(weights=None))
    sd, config = convert.from_torchvision(source.state_dict())
    assert (config.embed_dim, config.depth, config.num_heads) == (768, 12, 12)
    model = vitkit.load_pretrained(source.state_dict())
    x = images(224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)


def test_torchvision_representation_layer_is_reported():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    source = TVViT(
        image_size=32,
        patch_size=8,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
        representation_size=16,
    )
    with pytest.raises(CheckpointError, match=r"representation layer is not supported"):
        convert.from_torchvision(source.state_dict())


# -- the conv stem (`conv_stem_configs`, Xiao et al. 2021) -----------------------------------


def _stem_vit(*stem, **kwargs) -> torch.nn.Module:
    """A small torchvision ViT with a conv stem, random weights and BatchNorm statistics."""
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    torch.manual_seed(0)
    args = dict(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=64)
    model = TVViT(**{**args, "mlp_dim": 128, "num_classes": 7, **kwargs}, conv_stem_configs=stem)
    randomize(model)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(torch.rand(module.num_features, generator=gen) - 0.5)
                module.running_var.copy_(torch.rand(module.num_features, generator=gen) + 0.5)
                module.num_batches_tracked.fill_(123)
    return model.eval()


def test_torchvision_conv_stem_parity_and_round_trip(tmp_path):
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import ConvStemConfig

    source = _stem_vit(ConvStemConfig(16, 3, 2), ConvStemConfig(32, 3, 2))
    tv_sd = source.state_dict()
    sd, config = convert.from_torchvision(tv_sd, num_heads=4)
    assert (config.conv_stem, config.patch_size, config.img_size) == ((16, 32), 1, 32)
    assert (config.in_chans, config.embed_dim, config.num_classes) == (3, 64, 7)
    for theirs, ours in [
        ("conv_proj.conv_bn_relu_1.0.weight", "patch_embed.backbone.3.weight"),
        ("conv_proj.conv_bn_relu_1.1.running_mean", "patch_embed.backbone.4.running_mean"),
        ("conv_proj.conv_bn_relu_1.1.running_var", "patch_embed.backbone.4.running_var"),
        ("conv_proj.conv_bn_relu_0.1.num_batches_tracked",
         "patch_embed.backbone.1.num_batches_tracked"),
        ("conv_proj.conv_last.bias", "patch_embed.proj.bias"),
    ]:  # fmt: skip
        assert torch.equal(sd[ours], tv_sd[theirs]), ours
    torch.save(tv_sd, tmp_path / "tv_stem.pth")  # a file: the format is told from its keys
    model = vitkit.load_pretrained(tmp_path / "tv_stem.pth", num_heads=4)
    x = images(32, batch=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **TOL)  # 1e-5, see _parity.TOL
    # torchvision_kwargs builds the same torchvision model: the original weights load into it.
    rebuilt = source_model("torchvision", model.config, tv_sd)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), source(x), rtol=0, atol=0)


def test_torchvision_conv_stem_other_than_vitkits_is_refused():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from torchvision.models.vision_transformer import ConvStemConfig

    bn = torch.nn.BatchNorm2d
    cases = {
        r"layer 1 has a 5x5 kernel; vitkit's conv_stem is 3x3 stride-2 convolutions": (
            ConvStemConfig(16, 3, 2), ConvStemConfig(32, 5, 2, bn)
        ),
        r"layer 0 has a convolution bias and no norm \(norm_layer=None\)": (
            ConvStemConfig(16, 3, 2, None),
        ),
        r"layer 0 has a norm without running statistics \(not BatchNorm\)": (
            ConvStemConfig(16, 3, 2, lambda c: torch.nn.GroupNorm(4, c)),
        ),
        r"layer 0 has weights vitkit's stem lacks \(conv_proj.conv_bn_relu_0.2.weight: ": (
            ConvStemConfig(16, 3, 2, bn, lambda inplace: torch.nn.PReLU()),
        ),
    }  # fmt: skip
    for message, stem in cases.items():
        patch = 2 ** len(stem)
        with pytest.raises(CheckpointError, match=message):
            convert.from_torchvision(_stem_vit(*stem, patch_size=patch).state_dict(), num_heads=4)


def test_torchvision_kwargs_of_a_conv_stem_model():
    pytest.importorskip("torchvision", reason="torchvision not installed")
    stem = dict(conv_stem=(8, 16), patch_size=1, embed_dim=32, depth=1, num_heads=2)
    kwargs = convert.torchvision_kwargs(vitkit.ViTConfig(img_size=32, **stem))
    assert (kwargs["image_size"], kwargs["patch_size"]) == (32, 4)  # 2 stride-2 layers
    assert [tuple(c[:3]) for c in kwargs["conv_stem_configs"]] == [(8, 3, 2), (16, 3, 2)]
    assert [c.norm_layer for c in kwargs["conv_stem_configs"]] == [torch.nn.BatchNorm2d] * 2
    with pytest.raises(
        ValueError, match=r"needs img_size divisible by 4 .*not 30; use img_size=28"
    ):
        convert.torchvision_kwargs(vitkit.ViTConfig(img_size=30, **stem))
    with pytest.raises(ValueError, match=r"no conv stem followed by 2x2 patches"):
        convert.torchvision_kwargs(vitkit.ViTConfig(img_size=32, **{**stem, "patch_size": 2}))
    with pytest.raises(ValueError, match=r"takes 3-channel images; it needs in_chans=3, not 1"):
        convert.torchvision_kwargs(vitkit.ViTConfig(img_size=32, in_chans=1, **stem))


def test_train_pretrained_on_a_torchvision_conv_stem_file(tmp_path, capsys):
    pytest.importorskip("torchvision", reason="torchvision not installed")
    from PIL import Image
    from torchvision.models.vision_transformer import ConvStemConfig

    from vitkit import cli

    torch.save(_stem_vit(ConvStemConfig(16, 3, 2), ConvStemConfig(32, 3, 2)).state_dict(),
               tmp_path / "tv.pth")  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    for name in ("cat", "dog"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(8):
            pixels = torch.randint(0, 256, (36, 40, 3), dtype=torch.uint8, generator=gen).numpy()
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.png")
    argv = ["train", "--pretrained", str(tmp_path / "tv.pth"), "--data", str(tmp_path / "data")]
    argv += ["--img-size", "48", "--model-opt", "num_heads=4", "--epochs", "1"]
    argv += ["--batch-size", "4", "--out", str(tmp_path / "run"), "--no-progress"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    model = vitkit.load(tmp_path / "run" / "model.safetensors")
    assert (model.config.conv_stem, model.config.patch_size, model.config.num_classes) == (
        (16, 32), 1, 2
    )  # fmt: skip
    assert model.pos_embed.shape == (1, 1 + 12 * 12, 64)  # 8x8 grid resampled: 48 -> 24 -> 12


def test_the_builders_table_is_torchvisions():
    """`TORCHVISION_BUILDERS` holds each builder's sizes (read from the model it builds, on the
    meta device), and `torchvision_builder` tells them from a config."""
    torchvision = pytest.importorskip("torchvision", reason="torchvision not installed")
    from vitkit.weights.vit.torchvision import TORCHVISION_BUILDERS, torchvision_builder

    for name, (patch, layers, heads, hidden, mlp) in TORCHVISION_BUILDERS.items():
        with torch.device("meta"):
            built = getattr(torchvision.models, name)(weights=None)
        block = built.encoder.layers[0]
        assert (built.patch_size, len(built.encoder.layers), block.self_attention.num_heads,
                built.hidden_dim, built.mlp_dim) == (patch, layers, heads, hidden, mlp)  # fmt: skip
        config = vitkit.ViTConfig(patch_size=patch, depth=layers, embed_dim=hidden,
                                  num_heads=heads, mlp_ratio=mlp / hidden)  # fmt: skip
        assert torchvision_builder(config) == name
    assert torchvision_builder(vitkit.ViTConfig(embed_dim=768, depth=11, num_heads=12)) is None


@pytest.mark.slow  # two ViT-B/32 written and read: ~25 s on a shared 2-core machine
def test_cli_convert_checks_against_the_torchvision_builder(tmp_path, capsys):
    """`vitkit convert --from torchvision`: weights of `vit_b_32`'s sizes are checked against
    that builder, whose head count is torchvision's; `--arch vit_b_16` cannot hold them
    (exit 1)."""
    torchvision = pytest.importorskip("torchvision", reason="torchvision not installed")
    from vitkit import cli

    torch.manual_seed(0)
    source = randomize(torchvision.models.vit_b_32(weights=None, image_size=32, num_classes=5))
    torch.save(source.state_dict(), tmp_path / "b32.pth")
    argv = ["convert", "--from", "torchvision", str(tmp_path / "b32.pth"), str(tmp_path / "v.st")]
    assert cli.main(argv) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(
        "parity vs torchvision vit_b_32 (num_classes=5, image_size=32): max |difference| "
    )
    assert line.endswith(" over the logits of a random batch of 2 (ok, tolerance 1e-04)")
    assert vitkit.load(tmp_path / "v.st").config.num_heads == 12
    assert cli.main([*argv, "--arch", "vit_b_16"]) == 1
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .startswith(
            "parity vs torchvision vit_b_16 (num_classes=5, image_size=32): MISMATCH: that model "
            "does not hold these weights (wrong shape: conv_proj.weight: checkpoint (768, 3, 32, "
            "32) vs model (768, 3, 16, 16), "
        )
    )


def test_cli_convert_of_other_sizes_names_the_head_count(tmp_path, capsys):
    """No builder has these sizes: torchvision's VisionTransformer of them is the reference,
    and the head count it was given is named as assumed unless --num-heads states it."""
    torchvision = pytest.importorskip("torchvision", reason="torchvision not installed")
    from vitkit import cli

    torch.manual_seed(0)
    source = randomize(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=384,
        num_classes=4))  # fmt: skip
    torch.save(source.state_dict(), tmp_path / "tv.pth")
    argv = ["convert", "--from", "torchvision", str(tmp_path / "tv.pth"), str(tmp_path / "v.st")]
    assert cli.main(argv) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("parity vs torchvision's VisionTransformer: max |difference| ")
    assert line.endswith(
        "(ok, tolerance 1e-04); the weights do not record the head count (3 assumed): pass "
        "--num-heads N if it differs"
    )
    assert cli.main([*argv, "--num-heads", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("(ok, tolerance 1e-04)")
