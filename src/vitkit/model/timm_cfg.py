"""timm's `pretrained_cfg` / `default_cfg` on vitkit's models, stated once for every family: how
inputs are prepared (the loaded weights' data config, else the family's timm default) and where
the first conv and the classifier are, so `timm.data.resolve_data_config(model=model)` and
timm's fine-tuning helpers read a vitkit model as they read timm's."""

from __future__ import annotations

from typing import Any

from .layers.patch_embed import to_2tuple

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)


class TimmPretrainedCfg:
    """A model's timm `pretrained_cfg`: a family sets `TIMM_MEAN` / `TIMM_STD` (its timm
    default for 3-channel inputs; 0.5 per channel otherwise) and, where its classifier is not
    `head`, `timm_classifier`, and where its image meets another layer than the patch
    projection, `timm_first_conv`. The model needs `config` (`in_chans`, `img_size` as built, not as
    padded to whole patches, and `dynamic_img_size` where the family has it), `num_classes` and
    `data_config`; a cfg set by timm is kept as set."""

    # class attributes without annotations: TorchScript would read annotations as the
    # module's attributes to compile
    TIMM_MEAN = INCEPTION_MEAN
    TIMM_STD = INCEPTION_STD
    _pretrained_cfg = None  # a cfg set by timm (`model.pretrained_cfg = ...`)

    @property
    def timm_classifier(self) -> str | tuple[str, ...]:
        return "head"

    def timm_first_conv(self) -> str:
        """The module that takes the image (a method: TorchScript compiles properties)."""
        return "patch_embed.proj"

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        if self._pretrained_cfg is not None:
            return self._pretrained_cfg
        chans, (height, width) = self.config.in_chans, to_2tuple(self.config.img_size, "img_size")
        data = {
            "input_size": (chans, height, width),
            "interpolation": "bicubic",
            "crop_pct": 0.9,
            "crop_mode": "center",
            "mean": self.TIMM_MEAN if chans == 3 else (0.5,) * chans,
            "std": self.TIMM_STD if chans == 3 else (0.5,) * chans,
        }
        if self.data_config is not None:
            data = {key: getattr(self.data_config, key) for key in data}
        return {
            **data,
            "fixed_input_size": not getattr(self.config, "dynamic_img_size", False),
            "num_classes": self.num_classes,
            "pool_size": None,
            "first_conv": self.timm_first_conv(),
            "classifier": self.timm_classifier,
        }

    @pretrained_cfg.setter
    def pretrained_cfg(self, value: dict[str, Any]) -> None:
        self._pretrained_cfg = dict(value)

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name of `pretrained_cfg`."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, value: dict[str, Any]) -> None:
        self.pretrained_cfg = value
