"""Masked autoencoder pretraining: He et al., "Masked Autoencoders Are Scalable Vision Learners"
(CVPR 2022).

A random `mask_ratio` of the patches (0.75) is dropped per image; the ViT encoder sees only the
visible patches (plus its class token); a light decoder (`decoder_depth` blocks of width
`decoder_dim`) gets the encoded tokens back in place, a shared learned mask token at every
dropped position and a fixed 2-D sin-cos position table, and predicts each patch's pixels.
The loss is the mean squared error on the masked patches only, against pixels normalised per
patch (`norm_pix_loss`, the paper's Table 1e). After pretraining the encoder is an ordinary
`VisionTransformer` to fine-tune.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..layers import Block
from ..layers.patch_embed import patchify, to_2tuple
from ..layers.pos_embed import fixed_pos_embed
from .vit import VisionTransformer


def random_masking(
    batch: int,
    num_patches: int,
    keep: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """(ids_keep (B, keep), mask (B, N) with 1 at dropped patches): exactly `keep` patches per
    image, chosen uniformly at random (MAE's per-sample shuffle)."""
    noise = torch.rand(batch, num_patches, generator=generator, device=device)
    order = noise.argsort(dim=1)  # (B, N): a random permutation per image
    ids_keep = order[:, :keep].sort(dim=1).values  # (B, keep), in patch order
    mask = torch.ones(batch, num_patches, device=device)
    mask.scatter_(1, ids_keep, 0.0)
    return ids_keep, mask


class MaskedAutoencoder(nn.Module):
    """A ViT encoder with MAE's masking, light decoder and masked pixel loss.

    Args:
        encoder: the ViT to pretrain (its head is not used); a conv stem is refused, as its
            tokens do not map to pixel patches.
        mask_ratio: the share of patches dropped per image, in (0, 1).
        decoder_dim, decoder_depth, decoder_heads: the decoder's width, blocks and heads (the
            paper's default 512 / 8 / 16; small data wants far less).
        norm_pix_loss: predict each patch's pixels normalised by its own mean and variance.
    """

    def __init__(
        self,
        encoder: VisionTransformer,
        *,
        mask_ratio: float = 0.75,
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
        norm_pix_loss: bool = True,
    ) -> None:
        super().__init__()
        config = encoder.config
        if config.conv_stem:
            raise ValueError("MAE needs a ViT without conv_stem: its tokens must be patches")
        if not 0 < mask_ratio < 1:
            raise ValueError(f"mask_ratio must be in (0, 1), got {mask_ratio}")
        if decoder_dim % decoder_heads or decoder_dim % 4:
            raise ValueError(
                f"decoder_dim {decoder_dim} must be divisible by 4 and by decoder_heads "
                f"{decoder_heads}"
            )
        self.encoder = encoder
        self.mask_ratio = mask_ratio
        self.norm_pix_loss = norm_pix_loss
        self.patch_size = to_2tuple(config.patch_size, "patch_size")
        self.grid = encoder.patch_embed.grid_size
        self.num_prefix_tokens = encoder.num_prefix_tokens
        pixels = self.patch_size[0] * self.patch_size[1] * config.in_chans
        self.decoder_embed = nn.Linear(config.embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        table = fixed_pos_embed("sincos2d", self.grid, decoder_dim, self.num_prefix_tokens)
        self.register_buffer("decoder_pos_embed", table, persistent=False)
        self.decoder_blocks = nn.Sequential(
            *(Block(decoder_dim, num_heads=decoder_heads) for _ in range(decoder_depth))
        )
        self.decoder_norm = nn.LayerNorm(decoder_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_dim, pixels)
        nn.init.normal_(self.mask_token, std=0.02)
        for module in [self.decoder_embed, self.decoder_pred, *self.decoder_blocks.modules()]:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    @property
    def num_keep(self) -> int:
        """Visible patches per image."""
        return int(self.grid[0] * self.grid[1] * (1 - self.mask_ratio))

    def encode(self, images: Tensor, ids_keep: Tensor) -> Tensor:
        """The encoder on the visible patches: (B, P + keep, D) after its final norm."""
        tokens = self.encoder.embed(images)  # (B, P + N, D), positions added
        prefix, patches = tokens[:, : self.num_prefix_tokens], tokens[:, self.num_prefix_tokens :]
        index = ids_keep[..., None].expand(-1, -1, patches.shape[-1])  # (B, keep, D)
        visible = torch.gather(patches, 1, index)  # (B, keep, D)
        x = self.encoder.encode(torch.cat([prefix, visible], dim=1))  # checkpointed if on
        return self.encoder.norm(x)

    def decode(self, latent: Tensor, ids_keep: Tensor) -> Tensor:
        """Encoded tokens back in place, mask tokens elsewhere: (B, N, pixels per patch)."""
        x = self.decoder_embed(latent)  # (B, P + keep, Dd)
        prefix, visible = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        b, n = x.shape[0], self.grid[0] * self.grid[1]
        # (B, N, Dd), in x's dtype (bf16 / fp16 under autocast) for the scatter
        full = self.mask_token.expand(b, n, -1).to(x.dtype).clone()
        index = ids_keep[..., None].expand(-1, -1, x.shape[-1])
        full.scatter_(1, index, visible)
        x = torch.cat([prefix, full], dim=1) + self.decoder_pos_embed  # (B, P + N, Dd)
        x = self.decoder_norm(self.decoder_blocks(x))
        return self.decoder_pred(x[:, self.num_prefix_tokens :])  # (B, N, pixels)

    def target(self, images: Tensor) -> Tensor:
        """The pixels to predict per patch, (B, N, pixels), normalised per patch if asked."""
        patches = patchify(images, self.patch_size)
        if not self.norm_pix_loss:
            return patches
        mean = patches.mean(dim=-1, keepdim=True)
        var = patches.var(dim=-1, keepdim=True)
        return (patches - mean) / (var + 1e-6) ** 0.5

    def forward(
        self, images: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, prediction (B, N, pixels), mask (B, N) with 1 at dropped patches)."""
        b, n = images.shape[0], self.grid[0] * self.grid[1]
        ids_keep, mask = random_masking(
            b, n, self.num_keep, generator=generator, device=images.device
        )
        pred = self.decode(self.encode(images, ids_keep), ids_keep)
        error = ((pred.float() - self.target(images).float()) ** 2).mean(dim=-1)  # (B, N)
        loss = (error * mask).sum() / mask.sum()
        return loss, pred, mask
