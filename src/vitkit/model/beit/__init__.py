"""The BEiT family's room (timm's `beit.py`): BEiT and BEiT v2, a ViT whose blocks add a
relative position bias (layers/rel_pos_bias.py) to their scores, with BEiT's q / v biases and
LayerScale. `BEIT` is the record the registry keeps.

Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022); Peng et al., "BEiT v2:
Masked Image Modeling with Vector-Quantized Visual Tokenizers" (2022).
"""

from ..architecture import Architecture
from ..features import ViTBackbone
from .beit import Beit
from .config import BeitConfig
from .presets import beit_presets

BEIT = Architecture(
    name="beit",
    title="BEiT",
    config_class=BeitConfig,
    build=Beit,
    model_classes=(Beit,),
    presets=beit_presets(),
    backbone=ViTBackbone,  # Beit's forward_intermediates has the ViT's signature
    feature_unit="block",
    # The relative position bias is added to the scores before the softmax: the weights each
    # block hands back are the ones its forward pass multiplies v by, read as a ViT's.
    explanation="attention",
    fused_cpu=False,  # the CPU fast path's blocks do not take a relative position bias
    fixed_export_size=(
        "a BEiT's relative position tables are made for one patch grid (timm's Beit takes one "
        "input size)"
    ),
)

__all__ = ["BEIT", "Beit", "BeitConfig"]
