"""timm's model API (`get_classifier`, `reset_classifier`, `prune_intermediate_layers`,
`set_grad_checkpointing`) on vitkit's models, stated once for every family. The methods are
timm's (Wightman, pytorch-image-models), so timm's fine-tuning and `features_only` tools take a
vitkit model as one of their own; a family states only where it differs: its pooling
(`_reset_pool`), its head (`_new_head`) and what pruning removes (`_prune_norm`,
`_prune_head`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .intermediates import take_indices
from .layers.patch_embed import PatchEmbed
from .layers.pos_embed import resample_patch_embed
from .layers.weight_init import trunc_normal_
from .timm_cfg import TimmPretrainedCfg


class TimmApi(TimmPretrainedCfg):
    """timm's model API for a model with `config`, `blocks` (a list of blocks), `head`,
    `global_pool`, `num_classes`, `embed_dim`, `patch_embed` and `grad_checkpointing`; the
    defaults are a ViT's (a final `norm`, an `fc_norm` after pooling, a Linear head)."""

    def forward(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, num_classes); with `return_attention` (a family explained by its
        attention: its `forward_features` takes the flag), also every block's weights."""
        if return_attention:
            features, attentions = self.forward_features(x, return_attention=True)
            return self.forward_head(features), attentions
        return self.forward_head(self.forward_features(x))

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass: less activation memory, same gradients."""
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        """The classification head (timm's API): the module `timm_classifier` names first."""
        name = self.timm_classifier
        return self.get_submodule(name if isinstance(name, str) else name[0])

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh head for `num_classes` outputs (0: none), for fine-tuning; `global_pool` also
        changes the pooling, as timm's (timm's '' is 'none')."""
        if global_pool is not None:
            self._reset_pool(global_pool or "none")
        self.num_classes = num_classes
        self.config = self.config.replace(num_classes=num_classes)
        self.head = self._new_head(num_classes).to(self.patch_embed.proj.weight.device)

    def prune_intermediate_layers(
        self,
        indices: int | list[int] | tuple[int, ...] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the blocks after the last of `indices` (and the final norm, and the head) for
        a backbone that reads intermediates only, as timm's; returns the kept indices."""
        take = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max(take) + 1]
        if prune_norm:
            self._prune_norm()
        if prune_head:
            self._prune_head()
        return take

    def _patch_embed(self, bias: bool) -> PatchEmbed:
        """The patch embedding of `config`'s sizes, with the family's `_patch_embed_options`."""
        return PatchEmbed(
            img_size=self.config.img_size,
            patch_size=self.config.patch_size,
            in_chans=self.config.in_chans,
            embed_dim=self.config.embed_dim,
            bias=bias,
            **self._patch_embed_options(),
        )

    def _patch_embed_options(self) -> dict[str, Any]:
        """Other `PatchEmbed` arguments of the family (e.g. `dynamic_img_size`); none here."""
        return {}

    def _resize_patch_embed(
        self, img_size: int | tuple[int, int] | None, patch_size: int | None
    ) -> tuple[int, int]:
        """For `set_input_size`: a patch embedding (the family's `_patch_embed`) for another
        image and / or patch size holding the current one's weights, the kernel PI-resized to
        a new patch size (FlexiViT, `resample_patch_embed`); `config` follows. Returns the old
        patch grid."""
        old = self.patch_embed
        self.config = self.config.replace(
            img_size=self.config.img_size if img_size is None else img_size,
            patch_size=self.config.patch_size if patch_size is None else patch_size,
        )
        new = self._patch_embed(bias=old.proj.bias is not None)
        state = old.state_dict()
        state["proj.weight"] = resample_patch_embed(old.proj.weight.detach(), new.patch_size)
        new.load_state_dict(state)
        self.patch_embed = new.to(old.proj.weight.device).train(old.training)
        return old.grid_size

    def _reset_pool(self, global_pool: str) -> None:
        """Another pooling for `reset_classifier`; the norm stays where it is."""
        self.global_pool = global_pool
        has_fc_norm = not isinstance(self.fc_norm, nn.Identity)
        self.config = self.config.replace(global_pool=global_pool, use_fc_norm=has_fc_norm)

    def _new_head(self, num_classes: int) -> nn.Module:
        """A head for `reset_classifier`: trunc-normal(0.02) weights, zero biases."""
        head = nn.Linear(self.embed_dim, num_classes) if num_classes else nn.Identity()
        if isinstance(head, nn.Linear):
            trunc_normal_(head.weight)
            nn.init.zeros_(head.bias)
        return head

    def _prune_norm(self) -> None:
        self.norm = nn.Identity()

    def _prune_head(self) -> None:
        self.fc_norm = nn.Identity()
        self.reset_classifier(0, "none")
