"""Grad-CAM for hierarchical models (the Swin Transformer): the class-specific map of a model
whose token sets change from block to block.

Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
Localization" (ICCV 2017), on the last stage's map after the final norm, the map the head
pools: with F (B, h, w, C) that map and y the explained logit, a_c = mean_{h,w} dy/dF_c and
cam = relu(sum_c a_c F_c). Why this and not attention rollout: a Swin's attention is per window,
every second block rolls the windows, and patch merging fuses 2x2 tokens, so no attention
matrix spans the image and their product is undefined. The last map keeps the image's layout
(windows put back, shifts undone), and with average pooling Grad-CAM there is exact: a_c =
w_c / (h w), so the signed cells sum to the logit minus the head's bias (CAM, Zhou et al., CVPR
2016). Before the final LayerNorm it would not be: the norm is scale invariant per position,
so its gradients are orthogonal to the features they would weight. The price is resolution:
one cell per 32x32 pixels.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import explained_classes


def grad_cam(
    model: nn.Module, images: Tensor, *, target: int | Tensor | None = None
) -> dict[str, Tensor]:
    """Grad-CAM of a batch of normalised images (B, C, H, W) on the map the head pools, in
    eval mode (the training flag is restored).

    Args:
        model: a model with `forward_features` -> (B, h, w, C) (NHWC, as timm's Swin) and
            `forward_head`.
        images: the batch.
        target: the class to explain, one for all or one per image (default: the predicted).

    Returns `logits` (B, K); `target` (B,); `relevance` (B, h, w) >= 0, the Grad-CAM; `signed`
    (B, h, w), the same before the ReLU (with average pooling its cells sum to the logit minus
    the head's bias).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            # The input joins the graph so that frozen weights still give gradients.
            features = model.forward_features(images.detach().requires_grad_(True))
            if features.ndim != 4:
                raise ValueError(
                    f"Grad-CAM needs a (B, h, w, C) feature map; {type(model).__name__} gives "
                    f"{tuple(features.shape)}: explain a ViT with its attention maps instead"
                )
            logits = model.forward_head(features)
            if logits.ndim != 2:
                raise ValueError(
                    f"Grad-CAM explains a classifier's pooled logits (B, classes); this head gives "
                    f"{tuple(logits.shape)} (global_pool='none'?): pool the map, e.g. 'avg'"
                )
            chosen = explained_classes(target, logits)
            score = logits.gather(1, chosen[:, None]).sum()
            (gradient,) = torch.autograd.grad(score, features)
    finally:
        model.train(was_training)
    weights = gradient.float().mean(dim=(1, 2), keepdim=True)  # (B, 1, 1, C)
    signed = (weights * features.detach().float()).sum(-1)  # (B, h, w)
    return {
        "logits": logits.detach(),
        "target": chosen,
        "relevance": signed.clamp(min=0),
        "signed": signed,
    }
