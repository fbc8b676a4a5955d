"""What the model looks at, and how training went: attention maps and the run's pictures.

Attention rollout is Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020):
each layer's attention, fused over heads, plus the identity (the residual path), rows
renormalised, multiplied through the layers; the class token's row says how much each patch
fed it. The discard ratio is that of jacobgil's vit-explain: the lowest fraction of each fused
map is zeroed first (never the class token's attention to itself). The last-layer class-token
attention is the map of Dosovitskiy et al. (2021), Figure 6.

The class-specific map is Chefer, Gur & Wolf, "Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021), as in "Transformer
Interpretability Beyond Attention Visualization" (CVPR 2021): with A a block's attention and
grad_A the gradient of the chosen class logit with respect to it, R = I and, block by block,
R += mean_heads(clamp(grad_A * A, min=0)) @ R.

All maps come from `model(x, return_attention=True)` -> (logits, [(B, heads, N, N)] per
block). `explain_image` prepares a file as the model's data config says and draws the maps over
exactly the pixels the model saw (its resized, centre-cropped view, not the uncropped original).
Drawing uses matplotlib's Agg backend and writes PNG files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.data_config import DataConfig
from .data.images import image_to_tensor, open_image
from .data.transforms import Normalize, eval_resize_crop
from .plots import pyplot, save_figure

HEAD_FUSIONS = ("mean", "max", "min")
READOUTS = ("class", "mean")


def _fuse_heads(attention: Tensor, head_fusion: str) -> Tensor:
    """(B, heads, N, N) -> (B, N, N)."""
    if head_fusion == "mean":
        return attention.mean(1)
    if head_fusion == "max":
        return attention.amax(1)
    if head_fusion == "min":
        return attention.amin(1)
    raise ValueError(f"unknown head_fusion {head_fusion!r}; expected mean, max or min")


def _read_out(
    relevance: Tensor, num_prefix_tokens: int, grid: tuple[int, int], readout: str
) -> Tensor:
    """The rows the head reads, over the patches: (B, N, N) -> (B, gh, gw). 'class': the class
    token's row; 'mean': the mean of the patch tokens' rows (average pooling)."""
    if readout == "class":
        row = relevance[:, 0, num_prefix_tokens:]  # (B, gh * gw)
    elif readout == "mean":
        row = relevance[:, num_prefix_tokens:, num_prefix_tokens:].mean(1)  # (B, gh * gw)
    else:
        raise ValueError(f"unknown readout {readout!r}; expected class or mean")
    return row.reshape(-1, *grid)  # (B, gh, gw)


def attention_rollout(
    attentions: Sequence[Tensor],
    *,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    readout: str = "class",
) -> Tensor:
    """Rollout from the class token to each patch: (B, gh, gw), summing to at most 1.

    Args:
        attentions: one (B, heads, N, N) tensor per block, in order.
        num_prefix_tokens: class (and distillation) tokens before the patches.
        grid: the patch grid (gh, gw), gh * gw = N - num_prefix_tokens.
        head_fusion: 'mean', 'max' or 'min' over heads.
        discard_ratio: fraction of each image's fused (N, N) map set to zero, lowest values
            first, before the identity is added; the class token's self-attention is kept.
        readout: 'class' (the class token's row) or 'mean' (the patch rows' mean).
    """
    if not attentions:
        raise ValueError("attention rollout needs at least one attention map")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    first = attentions[0]
    tokens = first.shape[-1]
    eye = torch.eye(tokens, dtype=torch.float32, device=first.device)
    rollout = eye.expand(first.shape[0], tokens, tokens)  # (B, N, N)
    for attention in attentions:
        fused = _fuse_heads(attention.float(), head_fusion)  # (B, N, N)
        discard = int(tokens * tokens * discard_ratio)
        if discard:
            flat = fused.flatten(1).clone()  # (B, N * N)
            lowest = flat.topk(discard, dim=-1, largest=False).indices  # (B, discard)
            kept = flat[:, 0].clone()  # the class token's attention to itself
            flat.scatter_(1, lowest, 0.0)
            flat[:, 0] = kept
            fused = flat.reshape_as(fused)  # (B, N, N)
        fused = 0.5 * fused + 0.5 * eye
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused @ rollout  # (B, N, N)
    return _read_out(rollout, num_prefix_tokens, grid, readout)


def gradient_relevance(
    attentions: Sequence[Tensor],
    gradients: Sequence[Tensor],
    *,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    readout: str = "class",
) -> Tensor:
    """Class-specific relevance of each patch (Chefer et al. 2021): (B, gh, gw), >= 0.

    Args:
        attentions: one (B, heads, N, N) tensor per block, in order.
        gradients: the gradient of the explained logit with respect to each of them.
        num_prefix_tokens: class (and distillation) tokens before the patches.
        grid: the patch grid (gh, gw).
        readout: 'class' (the class token's row) or 'mean' (the patch rows' mean).
    """
    if not attentions or len(attentions) != len(gradients):
        raise ValueError("gradient_relevance needs one gradient per attention map (at least one)")
    first = attentions[0]
    tokens = first.shape[-1]
    relevance = torch.eye(tokens, dtype=torch.float32, device=first.device)
    relevance = relevance.repeat(first.shape[0], 1, 1)  # (B, N, N)
    for attention, grad in zip(attentions, gradients):
        cam = (grad.float() * attention.float()).clamp(min=0).mean(1)  # (B, N, N)
        relevance = relevance + cam @ relevance  # (B, N, N)
    return _read_out(relevance, num_prefix_tokens, grid, readout)


def cls_attention(attention: Tensor, *, num_prefix_tokens: int, grid: tuple[int, int]) -> Tensor:
    """The class token's attention to each patch in one block, per head: (B, heads, gh, gw)."""
    row = attention[:, :, 0, num_prefix_tokens:].float()  # (B, heads, gh * gw)
    return row.reshape(*row.shape[:2], *grid)  # (B, heads, gh, gw)


def attention_maps(
    model: nn.Module,
    images: Tensor,
    head_fusion: str = "mean",
    *,
    discard_ratio: float = 0.0,
    target: int | Sequence[int] | Tensor | None = None,
) -> dict[str, Tensor]:
    """Logits and maps for a batch of normalised images (B, C, H, W), in eval mode (the
    model's training flag is restored).

    Returns `logits` (B, K); `target` (B,), the explained class (given, else predicted);
    `relevance` (B, gh, gw), its class-specific map; `rollout` (B, gh, gw); `cls_attention`
    (B, gh, gw, head mean of the last block) and `cls_attention_heads` (B, heads, gh, gw).
    Only a model that pools its class token (global_pool='token') is read at the class
    token's row; the others ('avg', 'max', 'avgmax', the 'map' attention pool, 'none') have
    no such row to read, so every map reads the patch rows' mean (`readout_of`).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            # The input joins the graph so that frozen weights still give gradients.
            logits, attentions = model(images.detach().requires_grad_(True), return_attention=True)
            chosen = _targets(target, logits)
            score = logits.gather(1, chosen[:, None]).sum()
            gradients = torch.autograd.grad(score, attentions)
    finally:
        model.train(was_training)
    attentions = [a.detach() for a in attentions]
    grid = model.patch_embed.grid_for(*images.shape[-2:])
    prefix = model.num_prefix_tokens
    readout = readout_of(model)
    if readout == "class":
        heads = cls_attention(attentions[-1], num_prefix_tokens=prefix, grid=grid)
    else:  # no class-token row to read: the patch rows' mean, per head
        last = attentions[-1][:, :, prefix:, prefix:].float().mean(2)  # (B, heads, gh * gw)
        heads = last.reshape(*last.shape[:2], *grid)  # (B, heads, gh, gw)
    common = {"num_prefix_tokens": prefix, "grid": grid, "readout": readout}
    return {
        "logits": logits.detach(),
        "target": chosen,
        "relevance": gradient_relevance(attentions, gradients, **common),
        "rollout": attention_rollout(
            attentions, head_fusion=head_fusion, discard_ratio=discard_ratio, **common
        ),
        "cls_attention": heads.mean(1),
        "cls_attention_heads": heads,
    }


def readout_of(model: nn.Module) -> str:
    """'class' for a model whose head reads its class token, else 'mean' (the patch tokens'
    rows): max, avgmax and attention pooling have no one row to follow, so their maps show
    where the patch tokens look on average."""
    return "class" if getattr(model, "global_pool", "token") == "token" else "mean"


def _targets(target: int | Sequence[int] | Tensor | None, logits: Tensor) -> Tensor:
    """The class to explain per image, (B,): the given one(s), else the predicted."""
    batch, classes = logits.shape
    if target is None:
        return logits.detach().argmax(dim=-1)
    chosen = torch.as_tensor(target, device=logits.device).long().reshape(-1).expand(batch)
    bad = chosen[(chosen < 0) | (chosen >= classes)]
    if bad.numel():
        raise ValueError(
            f"class {int(bad[0])} is out of range for a model with {classes} classes; "
            f"choose 0 to {classes - 1}"
        )
    return chosen.clone()


def class_index(text: str, names: Sequence[str], *, given_as: str = "--class") -> int:
    """The class `text` names: a class name of the model, else an index (errors name it as
    `given_as`, the flag or parameter it came from)."""
    if text in names:
        return list(names).index(text)
    if text.isdigit() and int(text) < len(names):
        return int(text)
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    raise ValueError(
        f"{given_as} {text!r} is not a class of this checkpoint; give a name ({shown}) or an "
        f"index 0 to {len(names) - 1}"
    )


# -- one image file -------------------------------------------------------------------------


@dataclass(frozen=True)
class Explanation:
    """One image file explained, on the pixels the model saw.

    Args:
        image: (C, h, w) in [0, 1]: the model's view, un-normalised (resized and centre-cropped
            as its data config says); the maps are drawn over it.
        original: (C, H, W) in [0, 1]: the decoded file before resizing.
        region: (top, left, bottom, right) of the view in the original's pixel coordinates.
        caption: how the view was made from the file, for a picture or a log line.
        probabilities: (K,) softmax of the logits.
        predicted: the top class; `target` the explained one.
        maps: `attention_maps` output for this image (indexed by it).
    """

    image: Tensor
    original: Tensor
    region: tuple[float, float, float, float]
    caption: str
    probabilities: Tensor
    predicted: int
    target: int
    maps: dict[str, Tensor]


def explain_image(
    model: nn.Module,
    image_path: str | os.PathLike,
    data_config: DataConfig,
    *,
    target: int | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    per_head: bool = False,
    class_names: Sequence[str] | None = None,
    out: str | os.PathLike | None = None,
) -> Explanation:
    """Decode `image_path`, prepare it as `data_config` says (the pixels `data.eval_transform`
    gives), compute the maps and, with `out`, draw them over exactly that view.

    Args:
        model: a ViT whose forward takes `return_attention=True`.
        image_path: the image file (EXIF orientation applied, converted to the model's
            channels).
        data_config: the model's preparation (size, resize, crop, normalisation).
        target: the class to explain (default: the predicted one).
        head_fusion, discard_ratio: the rollout's (see `attention_rollout`).
        per_head: draw one panel per head of the last block too.
        class_names: names for the titles (default: the model's `meta['class_names']`).
        out: the PNG to write; None draws nothing.
    """
    decoded = open_image(image_path, in_chans=data_config.input_size[0])
    resize_crop = eval_resize_crop(data_config)
    view = image_to_tensor(resize_crop(decoded))  # (C, h, w) in [0, 1]
    x = Normalize(data_config.mean, data_config.std)(view)[None]  # (1, C, h, w)
    rollout = {"head_fusion": head_fusion, "discard_ratio": discard_ratio}
    maps = attention_maps(model, x.to(next(model.parameters()).device), **rollout, target=target)
    one = {key: value[0].cpu() for key, value in maps.items()}
    probabilities = torch.softmax(one["logits"].float(), dim=-1)
    (height, width), (h, w) = decoded.size[::-1], data_config.img_size
    explanation = Explanation(
        image=view,
        original=image_to_tensor(decoded),
        region=resize_crop.region(height, width),
        caption=f"maps over the model's {w}x{h} view: {resize_crop.describe(height, width)}",
        probabilities=probabilities,
        predicted=int(probabilities.argmax()),
        target=int(one["target"]),
        maps=one,
    )
    if out is not None:
        names = class_names or getattr(model, "meta", {}).get("class_names")
        names = list(names) if names else [str(i) for i in range(len(probabilities))]
        k = explanation.predicted
        draw_explanation(
            view,
            one,
            out,
            per_head=per_head,
            target_name=names[explanation.target],
            rollout_title=f"rollout ({head_fusion} of heads, discard {discard_ratio:g})",
            title=f"{Path(image_path).name}: predicted {names[k]} ({float(probabilities[k]):.3f})",
            readout=readout_of(model),
            original=explanation.original,
            region=explanation.region,
            caption=explanation.caption,
        )
    return explanation


# -- drawing --------------------------------------------------------------------------------


def _show_image(ax: Any, image: Tensor) -> None:
    array = image.detach().cpu().clamp(0, 1)
    if array.shape[0] == 1:
        ax.imshow(array[0].numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(array.permute(1, 2, 0).numpy())  # (H, W, C)
    ax.set_axis_off()


def _overlay(fig: Any, ax: Any, image: Tensor, heat: Tensor, title: str) -> None:
    """`heat` (gh, gw) resized to the image's own size (bilinear), blended over the image at
    half opacity, with a colour bar of its values."""
    _show_image(ax, image)
    size = image.shape[-2:]
    up = F.interpolate(heat.float()[None, None], size=size, mode="bilinear", align_corners=False)
    shown = ax.imshow(up[0, 0].cpu().numpy(), cmap="jet", alpha=0.5)  # (H, W)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title, fontsize=9)


def draw_explanation(
    image: Tensor,
    maps: dict[str, Tensor],
    path: str | os.PathLike,
    *,
    title: str = "",
    per_head: bool = False,
    target_name: str | None = None,
    rollout_title: str = "attention rollout",
    readout: str = "class",
    original: Tensor | None = None,
    region: tuple[float, float, float, float] | None = None,
    caption: str = "",
) -> None:
    """PNG: the image, then each map blended over it at the image's own resolution with a
    colour bar (the class-specific relevance when `maps` has it, the rollout, the last block's
    class-token attention) and, with `per_head`, a grid of that block's heads over the image.

    Args:
        image: (C, H, W) in [0, 1]: the pixels the model saw; the maps are resized to it.
        maps: one image's maps (`attention_maps` output indexed by the image).
        path: the PNG to write.
        title: the figure's title.
        per_head: add one panel per head of the last block.
        target_name: the explained class, for the relevance panel's title.
        rollout_title: the rollout panel's title (e.g. naming head fusion and discard ratio).
        readout: `readout_of(model)`: 'class' titles the last panel as the class token's
            attention, 'mean' as the patch tokens' mean attention.
        original, region: the file before resizing and the part of it the model saw (top,
            left, bottom, right); drawn first, the part boxed, when it is not the whole file.
        caption: a line under the title saying which pixels the maps lie on.
    """
    plt = pyplot()
    panels: list[tuple[str, Tensor | None]] = [("the model's view", None)]
    if "relevance" in maps:
        name = target_name if target_name is not None else str(int(maps.get("target", -1)))
        panels.append((f"relevance for class {name}", maps["relevance"]))
    panels.append((rollout_title, maps["rollout"]))
    last = "last-layer [CLS] attention" if readout == "class" else "last-layer mean patch attention"
    panels.append((last, maps["cls_attention"]))
    boxed = original is not None and region is not None and not _whole(region, original)
    first = 1 if boxed else 0
    heads = list(maps["cls_attention_heads"]) if per_head else []
    cols = max(first + len(panels), min(len(heads), 4))
    rows = 1 + -(-len(heads) // cols)
    height, width = image.shape[-2:]
    side = 3.0
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(cols * (side * max(width / height, 0.5) + 0.8), rows * side + 0.5),
        squeeze=False,
    )
    for ax in axes.flat:
        ax.set_axis_off()
    if boxed:
        _boxed(axes[0, 0], original, region)
    for ax, (name, heat) in zip(axes[0, first:], panels):
        if heat is None:
            _show_image(ax, image)
            ax.set_title(name, fontsize=9)
        else:
            _overlay(fig, ax, image, heat, name)
    for h, heat in enumerate(heads):
        _overlay(fig, axes[1 + h // cols, h % cols], image, heat, f"last block, head {h}")
    if title or caption:
        fig.suptitle("\n".join(t for t in (title, caption) if t), fontsize=10)
    save_figure(fig, path)


def _whole(region: tuple[float, float, float, float], image: Tensor) -> bool:
    top, left, bottom, right = region
    return top <= 0 and left <= 0 and (bottom, right) >= tuple(image.shape[-2:])


def _boxed(ax: Any, original: Tensor, region: tuple[float, float, float, float]) -> None:
    """The file before resizing, the part the model saw outlined."""
    import matplotlib.patches

    _show_image(ax, original)
    top, left, bottom, right = region
    # pixel centres are at integers in imshow: pixel edges at -0.5
    box = matplotlib.patches.Rectangle(
        (left - 0.5, top - 0.5), right - left, bottom - top, fill=False, edgecolor="yellow",
        linewidth=2,
    )  # fmt: skip
    ax.add_patch(box)
    ax.set_title("the file; the model saw the box", fontsize=9)
