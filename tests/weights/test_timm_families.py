"""Every timm `VisionTransformer` family loads with timm's outputs, or is refused in one line.

The full walk builds each name of `timm.list_models()` whose class is exactly timm's
`VisionTransformer` with a plain patch embedding (hybrids with CNN stems aside) and `Block` or
`ResPostBlock` blocks (parallel-block variants aside), at depth 1 and a 4 x 4 patch grid with
the real widths, perturbs every weight, converts it with `arch=name` when vitkit knows the
name, and compares outputs: within 1e-4 of timm's largest output, or a one-line refusal, never
a different function. It takes minutes, so it is `slow`; one model per family (narrowed to
width 96, at depth 2) runs in the fast suite.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
from _parity import randomize

import vitkit
from _helpers import optional_import, requires_timm
from vitkit import CheckpointError, convert
from vitkit.model.vit.presets import FAMILIES

timm = optional_import("timm")  # the tests that use it are marked requires_timm
PatchEmbed = optional_import("timm.layers").PatchEmbed
timm_vit = optional_import("timm.models.vision_transformer")

log = logging.getLogger(__name__)

RTOL = 1e-4  # of the largest |output| of timm's model


def _is_plain_vit(model: torch.nn.Module) -> bool:
    return (
        type(model) is timm_vit.VisionTransformer
        and type(model.patch_embed) is PatchEmbed
        and type(model.blocks[0]) in (timm_vit.Block, timm_vit.ResPostBlock)
    )


def _timm_model(name: str, depth: int = 2, **narrow) -> torch.nn.Module | None:
    """timm's `name` at `depth` on a 4 x 4 patch grid, perturbed; None if not a plain ViT."""
    torch.manual_seed(0)
    match = re.search(r"patch(\d+)", name)  # timm's names carry the patch size (else 16)
    side = 4 * (int(match[1]) if match else 16)
    model = timm.create_model(name, pretrained=False, depth=depth, img_size=side, **narrow)
    return randomize(model) if _is_plain_vit(model) else None


def compare(name: str, source: torch.nn.Module, **options) -> tuple[str, str]:
    """('identical' | 'refused' | 'different', detail) for timm's model `source`."""
    arch = name if name in vitkit.list_models() else None
    if arch is not None:
        options["arch"] = arch
    try:
        model = vitkit.load_pretrained(source.state_dict(), **options)
    except (CheckpointError, ValueError) as err:
        return "refused", str(err)
    h, w = source.patch_embed.img_size
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(x), source(x)
    if ours.shape != theirs.shape:
        return "different", f"shape {tuple(ours.shape)} vs timm {tuple(theirs.shape)}"
    error = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    return ("identical" if error <= RTOL else "different"), f"relative error {error:.2e}"


def _check(results: dict[str, tuple[str, str]]) -> None:
    counts = {kind: sum(r[0] == kind for r in results.values()) for kind in ("identical",
              "refused", "different")}  # fmt: skip
    log.info("timm ViT families: %s", counts)
    different = {n: detail for n, (kind, detail) in results.items() if kind == "different"}
    assert not different
    for name, (kind, detail) in results.items():
        if kind == "refused":
            assert "\n" not in detail and detail, name
            assert name not in vitkit.list_models(), f"{name} is registered but refused: {detail}"


# One variant per family row, narrowed to width 96 (4 heads) so that it builds in milliseconds.
REPRESENTATIVES = sorted(
    {min(family.configs(), key=lambda n: family.configs()[n].embed_dim) for family in FAMILIES}
)


@requires_timm
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_each_family_loads_with_timms_outputs(name):
    source = _timm_model(name, embed_dim=96, num_heads=4)
    assert source is not None, f"{name} is no longer a plain timm VisionTransformer"
    kind, detail = compare(name, source, num_heads=4)
    assert kind == "identical", f"{name}: {kind}: {detail}"


@requires_timm
@pytest.mark.slow
def test_every_timm_vision_transformer_is_identical_or_refused_in_one_line():
    results = {}
    for name in timm.list_models():
        module = timm.models._registry._model_to_module[name].rsplit(".", 1)[-1]
        if module not in ("vision_transformer", "deit"):
            continue
        source = _timm_model(name, depth=1)  # the real widths; one block keeps it to minutes
        if source is not None:
            results[name] = compare(name, source)
    _check(results)
    identical = sum(kind == "identical" for kind, _ in results.values())
    assert len(results) == 168 and identical == 168, {
        n: r for n, r in results.items() if r[0] != "identical"
    }


# -- what the weights cannot show -----------------------------------------------------------


@requires_timm
def test_the_name_supplies_the_activation_the_weights_cannot_show():
    name = "vit_base_patch32_siglip_gap_256"  # GELU's tanh approximation
    source = _timm_model(name, embed_dim=96, num_heads=4)
    _, config = convert.from_timm(source.state_dict(), arch=name, num_heads=4)
    assert (config.act_layer, config.global_pool, config.fc_norm) == ("gelu_tanh", "avg", False)
    assert compare(name, source, num_heads=4)[0] == "identical"
    guessed = vitkit.load_pretrained(source.state_dict(), num_heads=4)  # no name: exact GELU
    assert guessed.config.act_layer == "gelu"
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        assert not torch.allclose(guessed(x), source(x), rtol=RTOL, atol=0)


@requires_timm
def test_post_norm_blocks_come_from_the_name():
    source = _timm_model("vit_base_patch16_rpn_224", embed_dim=96, num_heads=4)
    _, config = convert.from_timm(source.state_dict(), arch="vit_base_patch16_rpn_224", num_heads=4)
    assert config.res_post_norm and not config.class_token and config.global_pool == "avg"


@requires_timm
@pytest.mark.parametrize(
    "name, message",
    [
        (
            "vit_base_patch16_clip_224",
            r"^the weights have CLIP-style norm_pre, whose act_layer and norm_eps they do not "
            r"record; pass arch='<timm model name>' or act_layer=NAME and norm_eps=X$",
        ),
        (
            "vit_base_patch16_siglip_224",
            r"^the weights have an attention-pool \(SigLIP\) head, whose act_layer they do not "
            r"record; pass arch='<timm model name>' or act_layer=NAME$",
        ),
        (
            "aimv2_large_patch14_224",
            r"^the weights have RMSNorm, whose norm_eps they do not record; pass "
            r"arch='<timm model name>' or norm_eps=X$",
        ),
    ],
)
def test_families_whose_hidden_options_vary_are_refused_without_the_name(name, message):
    source = _timm_model(name, embed_dim=96, num_heads=4)
    with pytest.raises(CheckpointError, match=message):
        convert.from_timm(source.state_dict(), num_heads=4)
    assert compare(name, source, num_heads=4)[0] == "identical"


@requires_timm
def test_no_embed_class_is_read_from_the_position_grid():
    source = _timm_model("deit3_small_patch16_224", embed_dim=96, num_heads=4)
    assert source.pos_embed.shape[1] == 16  # the patches only
    _, config = convert.from_timm(source.state_dict(), num_heads=4)
    assert config.no_embed_class and config.img_size == 64
    # 7 register tokens + class token = 8: 16 + 8 = 24 positions would not be square either way
    ambiguous = {"pos_embed": torch.zeros(1, 25, 96), "reg_token": torch.zeros(1, 8, 96)}
    sd = {**source.state_dict(), **ambiguous}  # 25 = 5 x 5, or 4 x 4 + 9 prefix tokens
    with pytest.raises(
        CheckpointError,
        match=r"positions \(9 prefix tokens\) fits both: .*; pass img_size=\(h, w\) or "
        r"no_embed_class=True / False$",
    ):
        convert.from_timm(sd, num_heads=4)


@requires_timm
def test_an_unknown_or_unsupported_arch_is_one_line():
    source = _timm_model("vit_small_patch16_224", embed_dim=96, num_heads=4)
    with pytest.raises(ValueError, match=r"^unknown model name 'vit_smol_patch16_224'; did you"):
        convert.from_timm(source.state_dict(), arch="vit_smol_patch16_224")
    with pytest.raises(
        ValueError, match=r"^timm's vit_base_resnet50d_224 uses a ResNet-D backbone"
    ):
        vitkit.create_model("vit_base_resnet50d_224")


def test_exporters_without_the_options_refuse_them():
    model = vitkit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, act_layer="gelu_tanh"
    )
    assert model.config.family_options() == ["act_layer='gelu_tanh'"]
    with pytest.raises(
        ValueError, match=r"it needs the paper's layers \(not act_layer='gelu_tanh'"
    ):
        convert.to_hf(model)


@requires_timm
def test_weights_without_a_name_log_what_they_assume(caplog):
    source = _timm_model("vit_small_patch16_224", embed_dim=96, num_heads=4)
    with caplog.at_level(logging.INFO, logger="vitkit.weights.vit.timm"):
        convert.from_timm(source.state_dict(), num_heads=4)
    assert "assuming exact GELU, pre-norm blocks and the norm epsilon 1e-06" in caplog.text
