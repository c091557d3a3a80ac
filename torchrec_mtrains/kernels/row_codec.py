"""RowCodec: moves rows between FBGEMM TBE slots and backing-store rows.

A store row is laid out as ``TableLayout`` says: the table's weights followed by the
optimizer state of that row, in the weights' dtype (fp32 state bits in an fp16 table take
two fp16 slots per value, a reinterpretation of its bytes, never a conversion).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from torchrec_mtrains.layout import TableLayout

__all__ = ["RowCodec"]


class RowCodec:
    """Packs and unpacks the store rows of one table laid out as ``layout``."""

    def __init__(self, layout: TableLayout) -> None:
        self.layout = layout
        self.dtype: torch.dtype = getattr(torch, layout.torch_dtype_name)

    def gather(self, weights: torch.Tensor, state: Optional[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
        """Rows of cache ``slots``: ``[len(slots), row_width]`` in the store dtype."""
        return torch.ops.mtrains.pack_rows(weights, self._state_2d(state), slots, self.dtype)

    def scatter(
        self, weights: torch.Tensor, state: Optional[torch.Tensor], slots: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Writes store ``rows`` into cache ``slots``."""
        torch.ops.mtrains.unpack_rows(rows.contiguous(), slots, weights, self._state_2d(state))

    def _state_2d(self, state: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if self.layout.state_values == 0:
            return None
        return state.view(state.shape[0], -1)

    def split(self, rows: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(weights, fp32 state shaped like FBGEMM's split_optimizer_states, or None)."""
        dim, state_values = self.layout.dim, self.layout.state_values
        w = rows[:, :dim]
        if state_values == 0:
            return w, None
        s = rows[:, dim:].contiguous().view(torch.float32)
        return w, (s.reshape(-1) if state_values == 1 else s)
