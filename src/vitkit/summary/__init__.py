"""What a model is made of, measured in one forward pass of zeros.

- `summary(model, input_size)`: any module's per-layer table (output shape, parameters, FLOPs
  counted by `flop_counter`), with totals (table.py).
- `flow(model, input_size)`: the stages a model describes of itself (`describe_flow`: a vitkit
  `VisionTransformer`, `SwinTransformer`, `Eva` or `Beit`), each measured as it ran;
  `compare_params` sets two encoders' side by side (walk.py, on the recording of record.py).
"""

from .table import LayerRow, ModelSummary, flop_counter, summary
from .walk import FlowRow, ModelFlow, compare_params, flow

__all__ = [
    "FlowRow",
    "LayerRow",
    "ModelFlow",
    "ModelSummary",
    "compare_params",
    "flop_counter",
    "flow",
    "summary",
]
