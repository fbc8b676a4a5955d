"""Every registered preset: sizes of the paper's Table 1, exact parameter counts, timm parity."""

import pytest
import torch

from _helpers import randomize, requires_timm
from vitkit import create_model, get_config, list_models
from vitkit.model import get_architecture
from vitkit.model.layers.patch_embed import to_2tuple
from vitkit.model.vit.family import SIZES
from vitkit.model.vit.presets import FAMILIES
from vitkit.model.vit.presets_blocks import BLOCK_FAMILIES
from vitkit.model.vit.presets_hybrid import HYBRID_FAMILIES
from vitkit.model.vit.presets_vitamin import VITAMIN_FAMILIES

# The paper's presets and vitkit's own; timm's other families are tested in test_families.py,
# the hybrids in test_hybrid.py, the other blocks in test_block_variants.py, ViTamin in
# test_vitamin.py.
_FAMILIES = FAMILIES + HYBRID_FAMILIES + BLOCK_FAMILIES + VITAMIN_FAMILIES
_FAMILY_NAMES = {name for family in _FAMILIES for name in family.configs()}
# The ViT names; the Swin presets are tested in test_swin_registry.py, the EVA's in test_eva.py.
_VIT_NAMES = sorted(get_architecture("vit").presets)
# The paper's sizes (Table 1; Ti and S from DeiT) at the patch sizes and resolutions it reports.
_PAPER_NAMES = [
    f"vit_{size}_patch{patch}_{res}"
    for size, patch, res in [
        *[(s, p, r) for s in ("tiny", "small", "base", "large") for p, r in ((16, 224), (16, 384))],
        ("small", 32, 224),
        ("base", 32, 224),
        ("base", 32, 384),
        ("large", 32, 224),
        ("huge", 14, 224),
    ]
]
_PRESETS = [n for n in _VIT_NAMES if n not in _FAMILY_NAMES or n in _PAPER_NAMES]

# Paper Table 1 (ViT-B/L/H) and DeiT Table 1 (Ti/S): (layers, hidden D, MLP size, heads, params).
PAPER = {
    "tiny": (12, 192, 768, 3, 5.7e6),
    "small": (12, 384, 1536, 6, 22e6),
    "base": (12, 768, 3072, 12, 86e6),
    "large": (24, 1024, 4096, 16, 307e6),
    "huge": (32, 1280, 5120, 16, 632e6),
}


def expected_params(config) -> int:
    """Count from the architecture: patch projection, tokens, positions, blocks, norm, head."""
    d, k = config.embed_dim, config.num_classes
    ph, pw = (config.patch_size,) * 2 if isinstance(config.patch_size, int) else config.patch_size
    h, w = (config.img_size,) * 2 if isinstance(config.img_size, int) else config.img_size
    hidden = int(d * config.mlp_ratio)
    stem, chans = 0, config.in_chans
    for out in config.conv_stem:  # 3x3 convolution without bias, BatchNorm scale and shift
        stem += chans * 9 * out + 2 * out
        chans, h, w = out, (h + 1) // 2, (w + 1) // 2
    patches = (h // ph) * (w // pw)
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d) + 4 * d
    return (
        stem
        + chans * ph * pw * d
        + d  # patch projection
        + d  # class token
        + (patches + 1) * d  # learned positions
        + config.depth * block
        + 2 * d  # final norm
        + d * k
        + k  # head
    )


@pytest.mark.parametrize("name", _PRESETS)
def test_every_preset_builds_runs_and_has_the_exact_parameter_count(name):
    config = get_config(name)
    model = create_model(name, depth=1) if config.depth > 4 else create_model(name)
    assert sum(p.numel() for p in model.parameters()) == expected_params(model.config)
    h, w = model.patch_embed.img_size
    x = torch.randn(1, config.in_chans, h, w)
    with torch.no_grad():
        out = model.eval()(x)
    assert out.shape == (1, config.num_classes)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("size", list(SIZES))
def test_sizes_are_the_papers_table_1(size):
    layers, dim, mlp, heads, params = PAPER[size]
    config = get_config(f"vit_{size}_patch{14 if size == 'huge' else 16}_224")
    assert (
        config.depth,
        config.embed_dim,
        int(config.embed_dim * config.mlp_ratio),
        config.num_heads,
    ) == (
        layers,
        dim,
        mlp,
        heads,
    )
    # The paper rounds; with a 1000-class head the counts are within 1.5% of its figures.
    assert expected_params(config) == pytest.approx(params, rel=0.015)


def test_known_exact_counts():
    assert expected_params(get_config("vit_base_patch16_224")) == 86_567_656
    assert expected_params(get_config("vit_base_patch16_224").replace(num_classes=3)) == 85_800_963
    with torch.device("meta"):
        model = create_model("vit_base_patch16_224", num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == 85_800_963


def test_unknown_name_lists_close_names():
    with pytest.raises(
        ValueError,
        match=r"unknown model name 'vit_base_patch16_225'; did you mean vit_base_patch16_224",
    ):
        create_model("vit_base_patch16_225")
    with pytest.raises(TypeError, match="unknown model option 'dim'"):
        create_model("vit_tiny_patch16_224", dim=3)


def _architectures() -> list[str]:
    """One preset per distinct architecture: the registry's names grouped by every option
    but the sizes (width, depth, heads, patch, resolution, classes, LayerScale's value)."""
    first: dict[object, str] = {}
    for name in _VIT_NAMES:
        config = get_config(name)
        patch = 1 if config.hybrid == "mbconv" else 16  # ViTamin's stem projects: patches of 1
        sizes = dict(img_size=224, patch_size=patch, embed_dim=64, depth=1, num_heads=1)
        scale = None if config.init_values is None else 1.0
        key = config.replace(**sizes, mlp_ratio=4.0, num_classes=1000, init_values=scale)
        first.setdefault(key, name)
    return sorted(first.values())


def _script_and_trace(name: str) -> None:
    """The preset as built (small sizes, CPU fast path on where torch has it), scripted and
    traced with nothing called first; both equal eager within 1e-5 (measured: at most 9e-7
    over the whole registry, the eager model taking its fused kernels, the compiled ones the
    plain path)."""
    config = get_config(name)
    ph, pw = to_2tuple(config.patch_size, "patch_size")
    stem = 2**config.stem_strides
    small = dict(depth=2, embed_dim=config.num_heads * 8, img_size=(2 * ph * stem, 3 * pw * stem))
    torch.manual_seed(0)
    model = create_model(name, **small).eval()
    classes = [type(m) for m in model.modules()]
    x = torch.randn(2, config.in_chans, *small["img_size"])
    with torch.no_grad():
        eager = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), eager, atol=1e-5, rtol=0)
        if not config.dynamic_img_size:  # the resampling's size comparison is Python's
            traced = torch.fx.symbolic_trace(model)
            torch.testing.assert_close(traced(x), eager, atol=1e-5, rtol=0)
    assert [type(m) for m in model.modules()] == classes


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", _architectures())
def test_every_architecture_scripts_and_traces_as_built(name):
    _script_and_trace(name)


def test_list_models_filters():
    assert "vit_digits" in list_models()
    assert list_models("vit_base*") == sorted(n for n in list_models() if n.startswith("vit_base"))


_TIMM_NAMES = [n for n in _PRESETS if not n.startswith(("vit_digits", "vit_mnist"))]


@requires_timm
@pytest.mark.parametrize("name", _TIMM_NAMES)
def test_parameter_counts_and_keys_equal_timm(name):
    import timm

    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        ours = create_model(name, num_classes=1000)
        theirs = timm.create_model(name, pretrained=False, num_classes=1000)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert list(ours_sd) == list(theirs_sd)
    assert all(ours_sd[k].shape == theirs_sd[k].shape for k in ours_sd)
    if name == "vit_huge_patch14_224":
        assert sum(p.numel() for p in ours.parameters()) == 632_045_800


@requires_timm
@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(class_token=False, global_pool="avg"),
        dict(img_size=(32, 48), patch_size=(8, 4), qkv_bias=False),
        dict(init_values=1e-2),
    ],
)
def test_a_timm_state_dict_loads_unchanged_and_computes_the_same(options):
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    small = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, num_classes=7)
    small.update(options)
    torch.manual_seed(0)
    theirs = randomize(TimmViT(**small))
    ours = create_model("vit_tiny_patch16_224", **small).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    h, w = ours.patch_embed.img_size
    x = torch.randn(2, 3, h, w)
    with torch.no_grad():  # measured at most 7.5e-8 on random weights; tolerance 1e-5
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def test_create_model_takes_timms_pretrained_argument_and_refuses_a_download():
    model = create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    assert model.head.out_features == 3
    with pytest.raises(ValueError) as refused:
        create_model("vit_tiny_patch16_224", pretrained=True)
    assert str(refused.value) == (
        "create_model builds vit_tiny_patch16_224 with random weights and downloads nothing; "
        "load weights with vitkit.load_pretrained(SOURCE): a file, a timm / Hugging Face "
        "folder, or a Hub id in the local cache ('timm/NAME')"
    )
