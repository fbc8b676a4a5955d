"""A Swin under timm's model tests (tests/test_models.py): `output_fmt` tells the layout of
`forward_features` (NHWC, as timm's Swin; NCHW for the V2-cr, as timm's), and torch.fx traces
every Swin to a model that computes the eager output bit for bit.

Models are narrowed (width 32, two blocks per stage) and perturbed as in test_swin.py."""

from __future__ import annotations

import pytest
import torch

from _helpers import perturb, requires_timm, requires_torchvision, timm_fx_model
from vitkit import create_model

NARROW = dict(embed_dim=32, num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))  # odd blocks shift
NAMES = ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "swinv2_cr_tiny_224"]


def narrow(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb(create_model(name, **{**NARROW, **options})).eval()


def images(model: torch.nn.Module, batch: int = 2) -> torch.Tensor:
    size = model.pretrained_cfg["input_size"]
    return torch.randn(batch, *size, generator=torch.Generator().manual_seed(1))


def spatial_axes(output_fmt: str) -> tuple[int, int]:
    """timm's `get_spatial_dim`: where H and W are in a map of this layout."""
    return (1, 2) if output_fmt == "NHWC" else (2, 3)


@pytest.mark.parametrize("name", NAMES)
def test_output_fmt_tells_the_layout_of_the_features(name):
    """timm's `test_model_forward_intermediates` reads the maps' layout from `output_fmt`
    (default NCHW): the last map is 1/32 of the input along the axes it names, and so is every
    intermediate asked in that layout."""
    model = narrow(name)
    x = images(model, batch=1)
    expected = {"swinv2_cr_tiny_224": "NCHW"}.get(name, "NHWC")
    assert model.output_fmt == expected
    axes = spatial_axes(model.output_fmt)
    with torch.no_grad():
        features = model.forward_features(x)
        final, maps = model.forward_intermediates(x, output_fmt=model.output_fmt)
    assert [features.shape[axis] for axis in axes] == [x.shape[2] // 32, x.shape[3] // 32]
    for info, feature_map in zip(model.feature_info, maps, strict=True):
        sides = [feature_map.shape[axis] for axis in axes]
        assert sides == [x.shape[2] // info["reduction"], x.shape[3] // info["reduction"]]


@requires_timm
@pytest.mark.parametrize("name", NAMES)
def test_output_fmt_is_timms(name):
    import timm

    theirs = timm.create_model(name, pretrained=False, **NARROW)
    assert narrow(name).output_fmt == getattr(theirs, "output_fmt", "NCHW")


@pytest.mark.parametrize(
    "name, options", [(name, {}) for name in NAMES] + [(NAMES[2], dict(global_pool="none"))]
)
def test_fx_traced_swin_computes_the_eager_bits(name, options):
    """timm's `test_model_forward_fx`: `torch.all(fx_outputs == outputs)`, with nothing
    branching on a traced value (the V2-cr's head asks its pooling, not the output's ndim)."""
    model = narrow(name, **options)
    x = images(model)
    outputs = model(x)
    fx_outputs = torch.fx.symbolic_trace(model)(x)
    assert not torch.isnan(outputs).any()
    assert torch.all(fx_outputs == outputs)


@requires_timm
@requires_torchvision
@pytest.mark.parametrize("name", NAMES)
def test_timms_fx_feature_extractor_traces_the_swin(name):
    model = narrow(name)
    x = images(model)
    outputs = model(x)
    fx_outputs = torch.cat(tuple(timm_fx_model(model)(x).values()))
    assert torch.all(fx_outputs == outputs)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", NAMES)
def test_torchscript_and_fx_then_torchscript_compute_the_eager_bits(name):
    """timm's `test_model_forward_torchscript` and `test_model_forward_fx_torchscript`: the
    scripted model, and the fx-traced one scripted (its annotations are types, not strings),
    run the eager model's operations."""
    model = narrow(name)
    x = images(model)
    with torch.no_grad():
        outputs = model(x)
        assert torch.equal(torch.jit.script(model)(x), outputs)
        assert torch.equal(torch.jit.script(torch.fx.symbolic_trace(model))(x), outputs)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_scripted_swin_with_masks_made_per_input_refuses_to_run():
    """With dynamic_img_size the shift masks are made per input, in Python: the scripted model
    says so rather than attend across the shifted regions."""
    model = narrow(NAMES[0], dynamic_img_size=True)
    scripted = torch.jit.script(model)
    with pytest.raises(torch.jit.Error, match="needs its shift masks built"):
        scripted(images(model))
