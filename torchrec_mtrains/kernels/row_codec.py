"""RowCodec: moves rows between FBGEMM TBE slots and backing-store rows.

A store row is the table's weights followed by the optimizer state of that row, in the
weights' dtype. FP16 tables keep FBGEMM's fp32 optimizer state bit-exact by storing each
fp32 value as two fp16 slots (a reinterpretation of its bytes, never a conversion).
"""

from __future__ import annotations

from typing import Optional

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType

__all__ = ["RowCodec", "SUPPORTED_OPTIMIZERS", "SUPPORTED_PRECISIONS"]

# fp32 optimizer-state values per row, as a function of dim (FBGEMM's layouts on CPU).
SUPPORTED_OPTIMIZERS = {
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: lambda dim: 1,
    EmbOptimType.EXACT_ADAGRAD: lambda dim: dim,
    EmbOptimType.EXACT_SGD: lambda dim: 0,
}
SUPPORTED_PRECISIONS = {SparseType.FP32: torch.float32, SparseType.FP16: torch.float16}


class RowCodec:
    """Row layout of one table: ``dim`` weights then ``state_values`` fp32 state values."""

    def __init__(self, dim: int, optimizer: EmbOptimType, weights_precision: SparseType) -> None:
        self.dim = dim
        self.optimizer = optimizer
        self.dtype = SUPPORTED_PRECISIONS[weights_precision]
        self.state_values = SUPPORTED_OPTIMIZERS[optimizer](dim)
        # fp32 state bits occupy 4 bytes: one fp32 slot or two fp16 slots.
        self.state_slots = self.state_values * (4 // torch.empty(0, dtype=self.dtype).element_size())

    @property
    def row_width(self) -> int:
        return self.dim + self.state_slots

    @property
    def row_bytes(self) -> int:
        return self.row_width * torch.empty(0, dtype=self.dtype).element_size()

    def gather(self, weights: torch.Tensor, state: Optional[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
        """Rows of cache ``slots``: ``[len(slots), row_width]`` in the store dtype."""
        return torch.ops.mtrains.pack_rows(weights, self._state_2d(state), slots, self.dtype)

    def scatter(
        self, weights: torch.Tensor, state: Optional[torch.Tensor], slots: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Writes store ``rows`` into cache ``slots``."""
        torch.ops.mtrains.unpack_rows(rows.contiguous(), slots, weights, self._state_2d(state))

    def _state_2d(self, state: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if self.state_values == 0:
            return None
        return state.view(state.shape[0], -1)

    def split(self, rows: torch.Tensor):
        """(weights, fp32 state shaped like FBGEMM's split_optimizer_states, or None)."""
        w = rows[:, : self.dim]
        if self.state_values == 0:
            return w, None
        s = rows[:, self.dim :].contiguous().view(torch.float32)
        return w, (s.reshape(-1) if self.state_values == 1 else s)
