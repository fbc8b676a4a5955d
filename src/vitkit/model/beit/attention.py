"""BEiT's self-attention: one qkv weight with separate `q_bias` / `v_bias` (keys are never
biased), and a relative position bias over the patch grid and the class token, the block's own
table and / or the one shared by every block.

Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022), Section 2.2; the table
and its index are the shared layer (layers/rel_pos_bias.py). Parameter names are timm's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.attention import bf16_cpu_training, exporting
from ..layers.rel_pos_bias import gather_bias, regrid, relative_position_index, table_rows


class BeitAttention(nn.Module):
    """Multi-head self-attention with BEiT's biases; `forward(x, shared_bias)` adds the shared
    table's bias (heads, N, N) to the block's own.

    The bias is added to the scores before the softmax, so the weights `forward_with_weights`
    returns are the ones the forward pass multiplies v by: attention maps read them as a ViT's.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        qkv_bias: bool = True,
        grid: tuple[int, int] | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.window_size = None if grid is None else tuple(grid)
        self.relative_position_bias_table = None
        index = None
        if self.window_size is not None:
            rows = table_rows(self.window_size, class_token=True)
            self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
            index = relative_position_index(self.window_size, class_token=True)
        self.register_buffer("relative_position_index", index, persistent=False)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused_attn = True  # timm's flag: False writes the attention out (`summary --flow`)

    def set_window_size(self, grid: tuple[int, int]) -> None:
        """Take another patch grid: the table resized as timm's, the index rebuilt."""
        regrid(self, grid)

    def position_bias(self, shared: Tensor | None) -> Tensor | None:
        """The bias added to the scores, (1, heads, N, N): the block's table plus the shared
        one's, either, or None."""
        bias = shared
        if self.relative_position_bias_table is not None:
            own = gather_bias(self.relative_position_bias_table, self.relative_position_index)
            bias = own if shared is None else own + shared
        return None if bias is None else bias.unsqueeze(0)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        batch, tokens, _ = x.shape
        bias = None
        if self.q_bias is not None and self.v_bias is not None:
            bias = torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias)  # (B, N, 3 * D)
        qkv = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim)  # (B, N, 3, h, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, hd)
        return q, k, v

    def _out(self, x: Tensor) -> Tensor:
        x = x.transpose(1, 2).flatten(2)  # (B, N, D)
        return self.proj_drop(self.proj(x))

    def forward(self, x: Tensor, shared_bias: Tensor | None = None) -> Tensor:
        """Tokens (B, N, D) -> (B, N, D): SDPA with the bias as its additive mask (timm's fused
        path), written out with `fused_attn` False, for bf16 training on CPU and under
        `torch.export` (whose ONNX decomposition of a masked SDPA fails:
        `layers.attention.exporting`)."""
        q, k, v = self._qkv(x)
        bias = self.position_bias(shared_bias)
        written = not self.fused_attn or bf16_cpu_training(q)
        if written or (not torch.jit.is_scripting() and exporting()):
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
            if bias is not None:
                scores = scores + bias
            weights = self.attn_drop(scores.softmax(dim=-1))
            return self._out(weights @ v)
        if bias is not None:
            bias = bias.to(q.dtype)
        dropout_p = self.attn_drop.p if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        return self._out(x)  # x was (B, heads, N, hd)

    def forward_with_weights(
        self, x: Tensor, shared_bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the attention weights (B, heads, N, N)."""
        q, k, v = self._qkv(x)
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        bias = self.position_bias(shared_bias)
        if bias is not None:
            scores = scores + bias
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        return self._out(self.attn_drop(weights) @ v), weights
