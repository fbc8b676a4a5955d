"""The building blocks of a Vision Transformer, one concept per file (as timm's and dinov2's
`layers/`), so that another architecture (a Swin) reuses the MLP, stochastic depth, the norms
and the patch-embedding convolution instead of copying them.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale" (ICLR 2021), Section 3.1 and Appendix B.1; each file cites the paper of what it adds.
Plain PyTorch only: the CPU fast path subclasses `Block` and `nn.Linear` outside this package;
these files know nothing of it, so a torch upgrade cannot break them.
"""

from .attention import Attention, AttentionPool
from .block import Block, ResPostBlock
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import (
    MLP_CLASSES,
    GeGLU,
    Mlp,
    QuickGELU,
    SwiGLU,
    SwiGLUPacked,
    make_act,
    mlp_hidden_width,
)
from .norm import LayerNorm2d, make_norm
from .patch_embed import (
    ConvStem,
    PatchEmbed,
    adapt_input_conv,
    conv_to_unfold_weight,
    unfold_to_conv_weight,
)
from .window import RelPosAttention, WindowBlock, window_partition, window_unpartition

__all__ = [
    "MLP_CLASSES",
    "Attention",
    "AttentionPool",
    "Block",
    "ConvStem",
    "DropPath",
    "GeGLU",
    "LayerNorm2d",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "QuickGELU",
    "RelPosAttention",
    "ResPostBlock",
    "SwiGLU",
    "SwiGLUPacked",
    "WindowBlock",
    "adapt_input_conv",
    "conv_to_unfold_weight",
    "make_act",
    "make_norm",
    "mlp_hidden_width",
    "unfold_to_conv_weight",
    "window_partition",
    "window_unpartition",
]
