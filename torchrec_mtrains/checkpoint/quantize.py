"""Lossy delta rows (off by default): a delta's weights stored in fewer bytes, as
Check-N-Run (NSDI'22) does for differential checkpoints of recommendation models.

A quantized chunk is a ``uint8`` tensor ``[count, quantized_row_bytes(spec, kind)]``: each
row's weights encoded, then its optimizer state's fp32 bytes as saved (exact):

- ``fp16``: the weights as float16 (2 bytes each);
- ``int8``: per row, fp32 ``scale`` and ``bias`` (the row's min), then one byte per weight:
  ``round((w - bias) / scale)``, ``scale = (max - min) / 255`` (0 when the row is constant).

Full steps stay exact: a chain's error is only that of the rows its deltas changed, and a
new full step ends it.
"""

from __future__ import annotations

import torch

from torchrec_mtrains.checkpoint.types import PieceSpec

__all__ = ["QUANTIZE_KINDS", "dequantize_rows", "quantize_rows"]

QUANTIZE_KINDS = ("fp16", "int8")


def _weight_bytes(spec: PieceSpec, kind: str) -> int:
    return spec.quantized_row_bytes(kind) - 4 * spec.state_values


def quantize_rows(spec: PieceSpec, rows: torch.Tensor, kind: str) -> torch.Tensor:
    """Rows as the tier stores them (``[n, row_width]`` of the spec's dtype) -> ``uint8``."""
    n = rows.shape[0]
    weights = rows[:, : spec.cols].to(torch.float32)
    state = rows[:, spec.cols :].contiguous().view(torch.uint8).reshape(n, -1)
    if kind == "fp16":
        coded = weights.to(torch.float16).view(torch.uint8).reshape(n, -1)
    elif kind == "int8":
        lo = weights.min(dim=1).values if spec.cols else torch.zeros(n)
        hi = weights.max(dim=1).values if spec.cols else torch.zeros(n)
        scale = (hi - lo) / 255.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round((weights - lo[:, None]) / safe[:, None]).clamp_(0, 255).to(torch.uint8)
        header = torch.stack([scale, lo], dim=1).contiguous().view(torch.uint8).reshape(n, 8)
        coded = torch.cat([header, codes], dim=1)
    else:
        raise ValueError(f"quantize={kind!r} must be one of {QUANTIZE_KINDS}")
    return torch.cat([coded, state], dim=1).contiguous()


def dequantize_rows(spec: PieceSpec, data: torch.Tensor, kind: str) -> torch.Tensor:
    """The inverse of ``quantize_rows`` (the weights as close as the encoding keeps them)."""
    n, width = data.shape[0], _weight_bytes(spec, kind)
    coded, state = data[:, :width].contiguous(), data[:, width:].contiguous()
    if kind == "fp16":
        weights = coded.view(torch.float16).to(torch.float32)
    else:
        header = coded[:, :8].contiguous().view(torch.float32)
        scale, lo = header[:, 0], header[:, 1]
        weights = coded[:, 8:].to(torch.float32) * scale[:, None] + lo[:, None]
    weights = weights.reshape(n, spec.cols).to(spec.torch_dtype)
    return torch.cat([weights, state.view(spec.torch_dtype).reshape(n, -1)], dim=1)
