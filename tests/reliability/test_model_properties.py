"""Property tests over model configurations: what holds for every valid one, and the
documented error for invalid ones."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitkit import VisionTransformer, ViTConfig
from vitkit.model.layers import conv_to_unfold_weight
from vitkit.options import option_fields

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@st.composite
def valid_configs(draw):
    patch = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    grid = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([4, 8]))
    pos_embed = draw(st.sampled_from(["learn", "sinusoid", "sincos2d", "none"]))
    pooling = draw(st.sampled_from(["token", "avg"]))
    return dict(
        img_size=(patch[0] * grid[0], patch[1] * grid[1]),
        patch_size=patch,
        in_chans=draw(st.integers(1, 3)),
        num_classes=draw(st.integers(0, 4)),
        embed_dim=heads * head_dim,
        depth=draw(st.integers(1, 2)),
        num_heads=heads,
        mlp_ratio=draw(st.sampled_from([1.0, 2.0, 4.0])),
        global_pool=pooling,
        class_token=pooling == "token" or draw(st.booleans()),
        pos_embed=pos_embed,
        init_values=draw(st.sampled_from([None, 0.1])),
    )


@SETTINGS
@given(config=valid_configs(), batch=st.integers(1, 3))
def test_every_valid_config_runs_forward_and_backward(config, batch):
    torch.manual_seed(0)
    model = VisionTransformer(**config)
    x = torch.randn(batch, config["in_chans"], *config["img_size"])
    out = model(x)
    width = config["num_classes"] or config["embed_dim"]
    assert out.shape == (batch, width)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@SETTINGS
@given(config=valid_configs())
def test_conv_and_unfold_embeddings_agree_for_every_config(config):
    torch.manual_seed(0)
    conv = VisionTransformer(**config).eval()
    unfold = VisionTransformer(**config, patch_embed="unfold").eval()
    state = conv.state_dict()
    state["patch_embed.proj.weight"] = conv_to_unfold_weight(state["patch_embed.proj.weight"])
    unfold.load_state_dict(state)
    x = torch.randn(2, config["in_chans"], *config["img_size"])
    torch.testing.assert_close(unfold(x), conv(x), atol=1e-5, rtol=1e-4)


@SETTINGS
@given(
    size=st.integers(2, 40),
    patch=st.integers(2, 9),
)
def test_indivisible_image_sizes_raise_the_documented_error(size, patch):
    if size % patch == 0:
        size += 1
    with pytest.raises(ValueError, match=f"img_size height {size} is not divisible by patch_size"):
        VisionTransformer(
            img_size=(size, patch), patch_size=patch, embed_dim=8, depth=1, num_heads=2
        )


@SETTINGS
@given(dim=st.integers(2, 64), heads=st.integers(2, 9))
def test_indivisible_heads_raise_the_documented_error(dim, heads):
    if dim % heads == 0:
        dim += 1
    with pytest.raises(ValueError, match=f"embed_dim {dim} is not divisible by num_heads {heads}"):
        VisionTransformer(img_size=8, patch_size=4, embed_dim=dim, depth=1, num_heads=heads)


@SETTINGS
@given(dim=st.sampled_from([6, 10, 14, 18]))
def test_sincos2d_needs_dim_divisible_by_four(dim):
    with pytest.raises(ValueError, match=f"needs embed_dim divisible by 4, got {dim}"):
        VisionTransformer(
            img_size=8, patch_size=4, embed_dim=dim, depth=1, num_heads=2, pos_embed="sincos2d"
        )


def test_nan_and_inf_stay_in_their_own_sample():
    """Documented: values are not checked (that would sync the device on every call); a NaN or
    inf pixel makes that image's output non-finite and leaves the other images untouched."""
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3
    ).eval()
    x = torch.randn(3, 3, 8, 8)
    clean = model(x)
    x[0, 1, 2, 3] = float("nan")
    x[2, 0, 0, 0] = float("inf")
    out = model(x)
    assert not torch.isfinite(out[0]).any() and not torch.isfinite(out[2]).any()
    torch.testing.assert_close(out[1], clean[1])


def test_same_seed_gives_the_same_weights_after_training_steps():
    def train() -> dict[str, torch.Tensor]:
        torch.manual_seed(123)
        model = VisionTransformer(
            img_size=8,
            patch_size=2,
            embed_dim=16,
            depth=2,
            num_heads=2,
            num_classes=4,
            drop_rate=0.1,
            drop_path_rate=0.1,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.state_dict()

    first, second = train(), train()
    assert all(torch.equal(first[k], second[k]) for k in first)


# The sizes: integer options with a declared range.
SIZES = {
    name: item.metadata["range"]
    for name, item in option_fields(ViTConfig).items()
    if item.metadata["range"] is not None and "int" in item.type
}


def test_every_size_has_a_range():
    assert {"img_size", "patch_size", "in_chans", "conv_stem", "num_classes", "embed_dim",
            "depth", "num_heads", "reg_tokens", "window_size", "global_blocks",
            "rel_pos_img_size", "conv_stem_strides", "hybrid_layers",
            "hybrid_widths"} == set(SIZES)  # fmt: skip


@SETTINGS
@given(
    name=st.sampled_from(sorted(SIZES)),
    value=st.integers(-(10**30), 10**30) | st.integers(-2, 70000),
)
def test_sizes_outside_their_limits_are_refused_before_anything_is_built(name, value):
    """Each size has a declared range (its field's); a value outside it is one error naming
    the range, raised by the config alone (no model, nothing allocated)."""
    bounds = SIZES[name]
    tuples = ("conv_stem", "global_blocks", "conv_stem_strides", "hybrid_layers", "hybrid_widths")
    setting = (value,) if name in tuples else value
    if bounds.holds(value):
        try:
            ViTConfig(**{name: setting})
        except ValueError as err:  # another rule (patch count, divisibility), not the range
            assert "must be in [" not in str(err)
    else:
        message = rf"^{name} must be in \[{bounds.low:.0f}, {bounds.high:.0f}\].*, got \(?{value}"
        with pytest.raises(ValueError, match=message):
            ViTConfig(**{name: setting})


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(img_size=20000, patch_size=2), "makes 100,000,000 patches; the most is 1,048,576"),
        (dict(mlp_ratio=1e9), "gives an MLP of width 768,000,000,000 for embed_dim 768"),
        (dict(conv_stem=(32, 100000)), r"conv_stem must be in \[1, 65536\] \(channels per layer\)"),
    ],
)
def test_sizes_that_multiply_beyond_the_limits_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**options)
