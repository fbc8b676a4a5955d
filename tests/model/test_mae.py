"""MAE: exactly the requested patches kept per image, the encoder sees only them, and the loss
covers the masked patches only (against per-patch normalised pixels)."""

from __future__ import annotations

import pytest
import torch

from vitkit import VisionTransformer
from vitkit.model.layers.patch_embed import patchify, unpatchify
from vitkit.model.vit.mae import MaskedAutoencoder, random_masking


def _mae(**options) -> MaskedAutoencoder:
    torch.manual_seed(0)
    encoder = VisionTransformer(img_size=(16, 24), patch_size=4, embed_dim=32, depth=2,
                                num_heads=2, num_classes=0)  # fmt: skip
    return MaskedAutoencoder(encoder, decoder_dim=16, decoder_depth=1, decoder_heads=2, **options)


@pytest.mark.parametrize("ratio", [0.75, 0.5, 0.9])
def test_masking_keeps_exactly_the_requested_patches(ratio):
    mae = _mae(mask_ratio=ratio)
    keep = int(24 * (1 - ratio))  # a 4 x 6 grid
    ids_keep, mask = random_masking(5, 24, keep, generator=torch.Generator().manual_seed(0))
    assert mae.num_keep == keep and ids_keep.shape == (5, keep)
    assert (mask.sum(dim=1) == 24 - keep).all()
    for row, kept in zip(mask, ids_keep):
        assert set(kept.tolist()) == set((row == 0).nonzero().flatten().tolist())
    assert len({tuple(k.tolist()) for k in ids_keep}) > 1  # each image its own draw


def test_patchify_round_trip_and_order():
    images = torch.randn(2, 3, 8, 12)
    patches = patchify(images, (4, 4))
    assert patches.shape == (2, 6, 48)
    assert torch.equal(unpatchify(patches, (4, 4), (2, 3)), images)
    # patch 1 is the top row's second patch, its pixels in (row, column, channel) order
    assert torch.equal(patches[0, 1], images[0, :, :4, 4:8].permute(1, 2, 0).reshape(-1))


def test_the_encoder_sees_only_the_visible_patches():
    mae = _mae()
    images = torch.randn(2, 3, 16, 24)
    ids_keep, _ = random_masking(2, 24, mae.num_keep, generator=torch.Generator().manual_seed(1))
    latent = mae.encode(images, ids_keep)
    assert latent.shape == (2, 1 + 6, 32)  # class token + 6 of 24 patches
    # changing a dropped patch's pixels leaves the encoding unchanged
    dropped = sorted(set(range(24)) - set(ids_keep[0].tolist()))[0]
    row, col = divmod(dropped, 6)
    changed = images.clone()
    changed[0, :, row * 4 : row * 4 + 4, col * 4 : col * 4 + 4] += 5.0
    torch.testing.assert_close(mae.encode(changed, ids_keep)[0], latent[0])


def test_the_loss_covers_only_masked_patches():
    mae = _mae()
    images = torch.randn(3, 3, 16, 24)
    loss, pred, mask = mae(images, generator=torch.Generator().manual_seed(2))
    target = patchify(images, (4, 4))
    target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6) ** 0.5
    per_patch = ((pred - target) ** 2).mean(-1)
    torch.testing.assert_close(loss, per_patch[mask.bool()].mean())
    grad = torch.autograd.grad(loss, pred)[0]  # (B, N, pixels)
    assert (grad[~mask.bool()] == 0).all() and (grad[mask.bool()] != 0).any()


def test_mae_options_are_checked():
    with pytest.raises(ValueError, match=r"mask_ratio must be in \(0, 1\), got 1.0"):
        _mae(mask_ratio=1.0)
    stem = VisionTransformer(img_size=16, patch_size=2, embed_dim=32, depth=1, num_heads=2,
                             conv_stem=(8,))  # fmt: skip
    with pytest.raises(ValueError, match="MAE needs a ViT without conv_stem"):
        MaskedAutoencoder(stem)
