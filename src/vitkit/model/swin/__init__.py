"""The Swin Transformer (V1, V2 and timm's V2-cr: `cr.py`) beside the ViT: its config, window
geometry, window attention, stages and model, reusing the shared layers (`model/layers/`).
`SWIN` and `SWIN_CR` are the records the registry keeps."""

from ..architecture import Architecture
from .backbone import SwinBackbone
from .config import SwinConfig
from .cr import SwinTransformerV2Cr
from .cr_config import SwinCrConfig
from .presets import swin_presets
from .swin import SwinTransformer

_PRESETS = swin_presets()
_SWIN_FACTS = dict(
    backbone=SwinBackbone,
    feature_unit="stage",
    explanation="gradcam",  # rollout does not apply across windows, shifts and merging
    fused_cpu=False,
    default_out_indices=lambda config: None,  # every stage, as timm
    fixed_export_size="a Swin exports at a fixed image size (its windows, padding and shift "
    "masks follow the input size, which torch.export does not trace)",
)
SWIN = Architecture(
    name="swin",
    title="Swin Transformer",
    config_class=SwinConfig,
    build=SwinTransformer,
    model_classes=(SwinTransformer,),
    presets={n: c for n, c in _PRESETS.items() if type(c) is SwinConfig},
    **_SWIN_FACTS,
)
SWIN_CR = Architecture(
    name="swin_cr",
    title="Swin Transformer V2-cr",
    config_class=SwinCrConfig,
    build=SwinTransformerV2Cr,
    model_classes=(SwinTransformerV2Cr,),
    presets={n: c for n, c in _PRESETS.items() if type(c) is SwinCrConfig},
    **_SWIN_FACTS,
)

__all__ = [
    "SWIN",
    "SWIN_CR",
    "SwinBackbone",
    "SwinConfig",
    "SwinCrConfig",
    "SwinTransformer",
    "SwinTransformerV2Cr",
]
