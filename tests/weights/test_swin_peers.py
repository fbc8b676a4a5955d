"""The Swin beside transformers' and torchvision's own Swins, where they give more than
logits or window otherwise: the attention weights of every window (`return_attention`, HF's
`output_attentions=True`); images of partial patches and maps of partial windows
(`dynamic_img_pad`, `windows_like`); torchvision's builders without a name, at any size;
transformers' backbone folders (`load_hf_swin_backbone`). Random weights far from any init,
tiny configs; equal within 1e-5."""

from __future__ import annotations

import pytest
import torch
from _parity import images, randomize_far

from _helpers import optional_import, requires_torchvision, requires_transformers
from vitkit import CheckpointError, SwinTransformer, load_pretrained
from vitkit.weights.swin.hf_backbone import load_hf_swin_backbone
from vitkit.weights.swin.torchvision import (
    from_torchvision_swin,
    torchvision_data_config,
    torchvision_swin_builder,
)

transformers = optional_import("transformers")
tv_swin = optional_import("torchvision.models.swin_transformer")
TOL = 1e-5


def _hf_model(version: int, **options) -> torch.nn.Module:
    """A two-stage HF `SwinModel` / `Swinv2Model` at 32 with patch 2 and windows of 4: stage
    maps 16 and 8, whole windows, every second block shifted."""
    config_cls = transformers.SwinConfig if version == 1 else transformers.Swinv2Config
    model_cls = transformers.SwinModel if version == 1 else transformers.Swinv2Model
    config = config_cls(**{**dict(embed_dim=16, depths=[2, 2], num_heads=[1, 2], image_size=32,
                                  patch_size=2, window_size=4), **options})  # fmt: skip
    return randomize_far(model_cls._from_config(config, attn_implementation="eager"))


def _hf_block_weights(hf: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every HF block's attention weights in order (HF returns the last block's per stage)."""
    found: list[torch.Tensor] = []
    hooks = [
        block.register_forward_hook(lambda _m, _i, out: found.append(out[1]))
        for stage in hf.encoder.layers
        for block in stage.blocks
    ]
    with torch.no_grad():
        hf(x, output_attentions=True)
    for hook in hooks:
        hook.remove()
    return found


@requires_transformers
@pytest.mark.parametrize("version", [1, 2])
def test_attention_weights_equal_transformers_output_attentions(version):
    hf = _hf_model(version)
    model = load_pretrained(hf.state_dict(), hf_config=hf.config)
    x = images(32, batch=2)
    with torch.no_grad():
        theirs = hf(x, output_attentions=True)
        features, attentions = model.forward_features(x, return_attention=True)
        logits, again = model(x, return_attention=True)
    assert [[tuple(w.shape) for w in stage] for stage in attentions] == [
        [(2 * 16, 1, 16, 16)] * 2,  # (B * nW, heads, N, N): 4x4 windows of a 16x16 map
        [(2 * 4, 2, 16, 16)] * 2,
    ]
    assert len(theirs.attentions) == 2  # the last block of each stage
    for ours, hf_weights in zip(attentions, theirs.attentions):
        torch.testing.assert_close(ours[-1], hf_weights, atol=TOL, rtol=TOL)
    every_block = [w for stage in attentions for w in stage]
    for ours, hf_weights in zip(every_block, _hf_block_weights(hf, x), strict=True):
        torch.testing.assert_close(ours, hf_weights, atol=TOL, rtol=TOL)
    hf_features = theirs.last_hidden_state.view(2, 8, 8, -1)  # (B, H/4, W/4, C)
    torch.testing.assert_close(features, hf_features, atol=TOL, rtol=TOL)
    torch.testing.assert_close(logits, model(x), atol=TOL, rtol=TOL)
    assert all(torch.equal(a, b) for s, t in zip(attentions, again) for a, b in zip(s, t))


@requires_transformers
def test_the_fused_path_stays_the_default_without_attention_weights(monkeypatch):
    """Version 1 calls SDPA once per block when no weights are asked, never when they are."""
    model = load_pretrained(_hf_model(1).state_dict(), hf_config=_hf_model(1).config)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    x = images(32)
    with torch.no_grad():
        plain = model(x)
        assert len(calls) == 4
        logits, _ = model(x, return_attention=True)
    assert len(calls) == 4
    torch.testing.assert_close(logits, plain, atol=TOL, rtol=TOL)


# -- image sizes that are not whole patches or whole windows ---------------------------------


@requires_transformers
@pytest.mark.parametrize("version", [1, 2])
def test_partial_patches_and_windows_give_transformers_outputs_with_its_padding(version):
    """At 54 on patch 4 HF pads the image to 56 (a 14x14 map), then each map to whole windows
    of 5 before the shift (14 -> 15, 7 -> 10): dynamic_img_pad and windows_like='hf' do the
    same; timm's windowing would differ, so the default read is refused naming the options."""
    hf = _hf_model(version, image_size=54, patch_size=4, window_size=5)
    with pytest.raises(CheckpointError, match=r"^image_size 54 is not a multiple of the patch "
                       r"size 4, which Hugging Face pads to whole patches; pass "
                       r"dynamic_img_pad=True and windows_like='hf' to do the same$"):  # fmt: skip
        load_pretrained(hf.state_dict(), hf_config=hf.config)
    model = load_pretrained(
        hf.state_dict(), hf_config=hf.config, dynamic_img_pad=True, windows_like="hf"
    )
    x = images(54, batch=2)
    with torch.no_grad():
        theirs = hf(x).last_hidden_state.view(2, 7, 7, -1)  # (B, 56/8, 56/8, C)
        ours = model.forward_features(x)
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)


@requires_transformers
def test_whole_patches_but_partial_windows_are_refused_then_read_with_windows_like_hf():
    hf = _hf_model(1, image_size=56, patch_size=4, window_size=5)
    message = (
        r"^at img_size 56 stage 0 is a 14x14 map for a window of 5, which Hugging Face V1 pads "
        r"or clamps unlike timm: no faithful copy; load at an img_size whose stage maps are "
        r"whole windows, or pass windows_like='hf' \(its windowing\)$"
    )
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(hf.state_dict(), hf_config=hf.config)
    model = load_pretrained(hf.state_dict(), hf_config=hf.config, windows_like="hf")
    x = images(56, batch=2)
    with torch.no_grad():
        theirs = hf(x).last_hidden_state.view(2, 7, 7, -1)
        torch.testing.assert_close(model.forward_features(x), theirs, atol=TOL, rtol=TOL)


def test_a_swin_of_partial_patches_is_refused_naming_dynamic_img_pad():
    with pytest.raises(ValueError, match=r"^img_size 30 is not a multiple of the patch size 4; "
                       r"use a multiple of 4, or pass dynamic_img_pad=True to pad the image to "
                       r"whole patches \(as Hugging Face's Swin does\)$"):  # fmt: skip
        SwinTransformer(img_size=30, embed_dim=16, depths=(2,), num_heads=(1,), window_size=4)
    model = SwinTransformer(img_size=30, embed_dim=16, depths=(2,), num_heads=(1,),
                            window_size=4, dynamic_img_pad=True, num_classes=3)  # fmt: skip
    assert model.config.grid_size == (8, 8) and model.pretrained_cfg["input_size"] == (3, 30, 30)
    assert model(images(30)).shape == (1, 3)


@pytest.mark.requires("timm", extra="interop")
def test_the_default_windowing_stays_timms_at_partial_windows():
    """timm's Swin rolls, then pads: vitkit's default gives timm's output where HF's
    windowing would differ (a 14x14 map in windows of 5)."""
    import timm

    from _helpers import perturb

    kwargs = dict(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=5)
    theirs = perturb(timm.create_model("swin_tiny_patch4_window7_224", **kwargs)).eval()
    ours = load_pretrained(theirs.state_dict(), img_size=56, window_size=5)
    hf_like = load_pretrained(theirs.state_dict(), img_size=56, window_size=5, windows_like="hf")
    x = images(56)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x),
                                   atol=TOL, rtol=TOL)  # fmt: skip
        assert (hf_like.forward_features(x) - theirs.forward_features(x)).abs().max() > 1e-2


# -- torchvision's builders ------------------------------------------------------------------


def _tv_tiny(window: int) -> torch.nn.Module:
    model = tv_swin.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2],
                                    num_heads=[1, 2], window_size=[window, window],
                                    num_classes=5)  # fmt: skip
    return randomize_far(model)


@requires_torchvision
def test_windows_like_torchvision_gives_torchvisions_logits_where_timms_windows_differ():
    """Windows of 5 on maps of 16 and 8 (and at 80x48: 20x12 and 10x6): torchvision pads,
    then shifts; at 64x16 the 4-row second map is padded to its window, not clamped."""
    source = _tv_tiny(5)
    with pytest.raises(CheckpointError, match=r"^at img_size 64 stage 0 is a 16x16 map for a "
                       r"window of 5, which torchvision pads or clamps unlike timm: no faithful "
                       r"copy; load at an img_size whose stage maps are whole windows, or pass "
                       r"windows_like='torchvision' \(its windowing\)$"):  # fmt: skip
        load_pretrained(source.state_dict(), img_size=64)
    model = load_pretrained(
        source.state_dict(), img_size=64, windows_like="torchvision", dynamic_img_size=True
    )
    for size in [(64, 64), (80, 48), (64, 16)]:
        x = images(size, batch=2)
        with torch.no_grad():
            torch.testing.assert_close(model(x), source(x), atol=TOL, rtol=TOL)


@requires_torchvision
@pytest.mark.parametrize("builder", ["swin_t", "swin_v2_b", *(
    pytest.param(name, marks=pytest.mark.slow) for name in ("swin_s", "swin_b", "swin_v2_t",
                                                           "swin_v2_s"))])  # fmt: skip
def test_a_torchvision_builders_weights_read_without_a_name_with_its_eval_transform(builder):
    """The sizes the tensors show name the builder (on the meta device: no memory): its eval
    size, torchvision's windowing at any input size, and the data config of its weights'
    `transforms()` (bicubic resize of the shorter side, centre crop, ImageNet statistics)."""
    import torchvision

    with torch.device("meta"):
        weights = getattr(torchvision.models, builder)().state_dict()
    _, config = from_torchvision_swin(weights)
    _, named = from_torchvision_swin(weights, arch=builder)
    assert config == named and torchvision_swin_builder(config) == builder
    assert (config.windows_like, config.dynamic_img_size) == ("torchvision", True)
    enum = builder.replace("swin", "Swin").replace("_t", "_T").replace("_s", "_S")
    enum = enum.replace("_b", "_B").replace("v2", "V2") + "_Weights"
    transform = getattr(torchvision.models, enum).IMAGENET1K_V1.transforms()
    data = torchvision_data_config(config)
    assert data.input_size == (3, *transform.crop_size * 2)
    assert round(transform.crop_size[0] / data.crop_pct) == transform.resize_size[0]
    assert data.interpolation == transform.interpolation.value
    assert (data.mean, data.std) == (tuple(transform.mean), tuple(transform.std))


@pytest.mark.slow
@requires_torchvision
def test_torchvision_swin_t_gives_its_logits_at_224_and_at_other_sizes():
    import torchvision

    source = randomize_far(torchvision.models.swin_t())
    model = load_pretrained(source.state_dict(), arch="swin_t")
    assert model.data_config.crop_pct == 224 / 232
    for size in [(224, 224), (256, 192)]:
        x = images(size)
        with torch.no_grad():
            ours, theirs = model(x), source(x)
        # 12 blocks of weights far from init: logits up to ~100, so relative to the largest
        assert ((ours - theirs).abs().max() / theirs.abs().max()).item() < TOL


# -- transformers' Swin backbones ------------------------------------------------------------


@requires_transformers
@pytest.mark.parametrize("version", [1, 2])
def test_transformers_backbone_folders_give_its_feature_maps(tmp_path, version):
    """SwinBackbone: per-stage norms and always_partition; Swinv2Backbone: no norms and no
    final norm. Out features stage1 and stage3, at the folder's size and at another."""
    config_cls = transformers.SwinConfig if version == 1 else transformers.Swinv2Config
    backbone_cls = transformers.SwinBackbone if version == 1 else transformers.Swinv2Backbone
    config = config_cls(embed_dim=16, depths=[2, 2, 2], num_heads=[1, 2, 4], image_size=64,
                        patch_size=4, window_size=4, out_features=["stage1", "stage3"])  # fmt: skip
    hf = randomize_far(backbone_cls._from_config(config, attn_implementation="eager"))
    hf.save_pretrained(tmp_path)
    name = backbone_cls.__name__
    with pytest.raises(CheckpointError, match=rf"^the config is of a transformers {name}; read "
                       r"its folder with vitkit\.weights\.swin\.hf_backbone\."):  # fmt: skip
        load_pretrained(tmp_path)
    backbone = load_hf_swin_backbone(tmp_path, dynamic_img_size=True)
    assert backbone.out_indices == [0, 2] and backbone.channels == [16, 64]
    assert (backbone.stage_norms is not None) == (version == 1)
    for size in [(64, 64), (96, 64)]:
        x = images(size, batch=2)
        with torch.no_grad():
            theirs, ours = hf(x).feature_maps, backbone(x)
        assert len(ours) == len(theirs) == 2
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


@requires_transformers
def test_a_backbone_of_the_stem_is_refused(tmp_path):
    config = transformers.SwinConfig(embed_dim=16, depths=[2], num_heads=[1], image_size=32,
                                     window_size=4, out_features=["stem", "stage1"])  # fmt: skip
    transformers.SwinBackbone(config).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"out_features \['stem', 'stage1'\] include "
                       r"'stem' \(the patch embedding\), which vitkit's SwinBackbone does not "
                       r"give; read the stages only$"):  # fmt: skip
        load_hf_swin_backbone(tmp_path)
