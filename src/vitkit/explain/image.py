"""One image file explained, and the picture: the maps drawn over exactly the pixels the model
saw (its resized, centre-cropped view, not the uncropped original), with matplotlib's Agg
backend, as PNG files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.data_config import DataConfig
from ..data.images import image_to_tensor, open_image
from ..data.transforms import Normalize, eval_resize_crop
from ..plots import figure_png, pyplot, save_figure
from .attention import attention_maps, readout_of
from .gradcam import grad_cam
from .method import explanation_method


@dataclass(frozen=True)
class Explanation:
    """One image file explained, on the pixels the model saw.

    Args:
        image: (C, h, w) in [0, 1]: the model's view, un-normalised (resized and centre-cropped
            as its data config says); the maps are drawn over it.
        original: (C, H, W) in [0, 1]: the decoded file before resizing.
        region: (top, left, bottom, right) of the view in the original's pixel coordinates.
        caption: how the view was made from the file, for a picture or a log line.
        probabilities: (K,) the class probabilities: a softmax of the logits, or each class's
            sigmoid for a multi-label model (`meta['multi_label']`), as `vitkit predict` gives.
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
        model: a ViT (its attention maps) or a Swin (its Grad-CAM, `grad_cam`: the rollout
            options do not apply), as `explanation_method` decides.
        image_path: the image file (EXIF orientation applied, converted to the model's
            channels).
        data_config: the model's preparation (size, resize, crop, normalisation).
        target: the class to explain (default: the predicted one).
        head_fusion, discard_ratio: the rollout's (see `attention_rollout`).
        per_head: draw one panel per head of the last block too (a ViT's).
        class_names: names for the titles (default: the model's `meta['class_names']`).
        out: the PNG to write; None draws nothing.
    """
    decoded = open_image(image_path, in_chans=data_config.input_size[0])
    resize_crop = eval_resize_crop(data_config)
    view = image_to_tensor(resize_crop(decoded))  # (C, h, w) in [0, 1]
    x = Normalize(data_config.mean, data_config.std)(view)[None]  # (1, C, h, w)
    x = x.to(next(model.parameters()).device)
    method = explanation_method(model)
    attention = method == "attention"
    rollout = {"head_fusion": head_fusion, "discard_ratio": discard_ratio}
    maps = _maps(model, method, x, target=target, per_head=per_head, **rollout)
    one = {key: value[0].cpu() for key, value in maps.items()}
    logits = one["logits"].float()
    multi_label = getattr(model, "meta", {}).get("multi_label", False)
    probabilities = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)
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
            readout=readout_of(model) if attention else "class",
            relevance_title="relevance" if attention else "Grad-CAM (last stage)",
            original=explanation.original,
            region=explanation.region,
            caption=explanation.caption,
        )
    return explanation


def _maps(
    model: nn.Module,
    method: str | None,
    x: Tensor,
    *,
    target: int | None,
    per_head: bool,
    **rollout: Any,
) -> dict[str, Tensor]:
    """The maps of a batch of normalised images by `method`, the model's `explanation_method`."""
    if method == "attention":
        return attention_maps(model, x, **rollout, target=target)
    if method is None:
        raise ValueError(
            f"{type(model).__name__} has no attention to draw; explain_image takes a ViT "
            "(its attention maps) or a Swin (its Grad-CAM)"
        )
    if per_head:
        raise ValueError(
            f"{type(model).__name__} has no attention heads over the whole image to draw; its "
            "map is Grad-CAM: leave per_head off"
        )
    return grad_cam(model, x, target=target)


# -- drawing --------------------------------------------------------------------------------


def _show_image(ax: Any, image: Tensor) -> None:
    array = image.detach().cpu().clamp(0, 1)
    if array.shape[0] == 1:
        ax.imshow(array[0].numpy(), cmap="gray", vmin=0, vmax=1)
    else:
        ax.imshow(array.permute(1, 2, 0).numpy())  # (H, W, C)
    ax.set_axis_off()


# How a map is laid over the image: a colour map whose lightness rises with the value
# (viridis; jet's rises and falls, drawing edges the map does not have and hiding the image's
# own), at 0.4 opacity, so that the image shows through: a grey one in grey, a colour one in
# colour. The correlation of the overlay's lightness with a digit's stays above 0.9, where jet
# at 0.5 drops below 0.8 (tests/test_explain.py).
OVERLAY_CMAP = "viridis"
OVERLAY_ALPHA = 0.4
OVERLAY_SIDE = 224  # the shorter side of `overlay_figure`'s view: small views are enlarged


def overlay_pixels(image: Tensor, heat: Tensor) -> Tensor:
    """(H, W, 3) in [0, 1]: `heat` (gh, gw) resized to `image` (C, H, W) in [0, 1] (bilinear),
    scaled to [0, 1], coloured with `OVERLAY_CMAP` and blended over the image at
    `OVERLAY_ALPHA`."""
    from matplotlib import colormaps

    size = image.shape[-2:]
    up = _resized(heat, size)
    up = (up - up.min()) / (up.max() - up.min()).clamp_min(1e-12)
    colour = torch.from_numpy(colormaps[OVERLAY_CMAP](up.numpy())[..., :3]).float()  # (H, W, 3)
    view = image.detach().float().cpu().clamp(0, 1).expand(3, *size).permute(1, 2, 0)
    return (1 - OVERLAY_ALPHA) * view + OVERLAY_ALPHA * colour  # (H, W, 3)


def _resized(heat: Tensor, size: Sequence[int]) -> Tensor:
    """(gh, gw) -> (H, W), bilinear."""
    heat = heat.detach().float().cpu()[None, None]  # (1, 1, gh, gw)
    return F.interpolate(heat, size=tuple(size), mode="bilinear", align_corners=False)[0, 0]


def _overlay(fig: Any, ax: Any, image: Tensor, heat: Tensor, title: str) -> None:
    """`overlay_pixels` on `ax`, with a colour bar of the map's values."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize as ColourScale

    up = _resized(heat, image.shape[-2:])
    ax.imshow(overlay_pixels(image, heat).numpy())
    ax.set_axis_off()
    scale = ColourScale(float(up.min()), float(up.max()))
    fig.colorbar(ScalarMappable(scale, OVERLAY_CMAP), ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title, fontsize=9)


def overlay_figure(image: Tensor, heat: Tensor, *, title: str, caption: str = "") -> Any:
    """One map over the image, with its colour bar, `title` (what is predicted and by which
    method) and `caption` above: the served /explain picture, drawn as `vitkit explain`
    draws its panels. A small view is enlarged (bilinear) to `OVERLAY_SIDE` pixels first."""
    plt = pyplot()
    height, width = image.shape[-2:]
    scale = max(1.0, OVERLAY_SIDE / min(height, width))
    size = (round(height * scale), round(width * scale))
    view = image.detach().float().cpu()[None]  # (1, C, h, w)
    view = F.interpolate(view, size=size, mode="bilinear", align_corners=False)[0]
    fig, ax = plt.subplots(figsize=(3.0 * max(width / height, 0.5) + 0.8, 3.6))
    _overlay(fig, ax, view.clamp(0, 1), heat, "")
    lines = "\n".join(t for t in (title, caption) if t)
    fig.suptitle(lines, fontsize=8, y=1.0, va="bottom")
    return fig


def overlay_png(image: Tensor, heat: Tensor, *, title: str, caption: str = "") -> bytes:
    """`overlay_figure` as PNG bytes (the served /explain picture)."""
    return figure_png(overlay_figure(image, heat, title=title, caption=caption))


def map_title(map_name: str, method: str | None, target_name: str) -> str:
    """What a map shows and how it was made: 'attention relevance for class 7',
    'Grad-CAM (last stage) for class dog', 'attention rollout', 'last-layer [CLS] attention'."""
    if map_name == "relevance":
        how = "Grad-CAM (last stage)" if method == "gradcam" else "attention relevance"
        return f"{how} for class {target_name}"
    return {"rollout": "attention rollout", "cls_attention": "last-layer [CLS] attention"}.get(
        map_name, map_name
    )


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
    relevance_title: str = "relevance",
    original: Tensor | None = None,
    region: tuple[float, float, float, float] | None = None,
    caption: str = "",
) -> None:
    """PNG: the image, then each map `maps` has blended over it at the image's own resolution
    with a colour bar (the class-specific relevance or Grad-CAM, the rollout, the last block's
    class-token attention) and, with `per_head`, a grid of that block's heads over the image.

    Args:
        image: (C, H, W) in [0, 1]: the pixels the model saw; the maps are resized to it.
        maps: one image's maps (`attention_maps` output indexed by the image).
        path: the PNG to write.
        title: the figure's title.
        per_head: add one panel per head of the last block.
        target_name: the explained class, for the relevance panel's title.
        rollout_title: the rollout panel's title (e.g. naming head fusion and discard ratio).
        relevance_title: what the class-specific panel is called ('relevance', 'Grad-CAM').
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
        panels.append((f"{relevance_title} for class {name}", maps["relevance"]))
    if "rollout" in maps:
        panels.append((rollout_title, maps["rollout"]))
    last = "last-layer [CLS] attention" if readout == "class" else "last-layer mean patch attention"
    if "cls_attention" in maps:
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
        lines = "\n".join(t for t in (title, caption) if t)
        fig.suptitle(lines, fontsize=10, y=1.0, va="bottom")  # above the panels' titles
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
        (left - 0.5, top - 0.5),
        right - left,
        bottom - top,
        fill=False,
        edgecolor="yellow",
        linewidth=2,
    )
    ax.add_patch(box)
    ax.set_title("the file; the model saw the box", fontsize=9)
