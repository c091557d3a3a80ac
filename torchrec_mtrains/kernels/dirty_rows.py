"""DirtyRows: which rows of a table changed since a point in time.

One bit per row (a ``uint8`` bitmap), so a 1e9-row table costs 125 MB. The kernel marks
the rows each training step looks up (the only rows its update touches), every table's in
one C++ call per step (``torch.ops.mtrains.mark_row_bits`` on ``bits``); a differential
checkpoint saves the marked rows and clears the marks once the checkpoint is complete.
"""

from __future__ import annotations

import torch

from torchrec_mtrains._ops import load_extension

__all__ = ["DirtyRows"]

_SCAN_BYTES = 1 << 17  # bitmap bytes unpacked at a time (1M rows, 1 MiB of scratch)
_BIT = torch.tensor([1 << b for b in range(8)], dtype=torch.uint8)
_POPCOUNT = torch.tensor([bin(b).count("1") for b in range(256)], dtype=torch.int64)  # marks per byte


class DirtyRows:
    """A bitmap of ``num_rows`` rows; not thread-safe (the kernel serialises its writers)."""

    def __init__(self, num_rows: int) -> None:
        if num_rows < 0:
            raise ValueError(f"num_rows={num_rows} must be >= 0")
        self.num_rows = num_rows
        self._bits = torch.zeros((num_rows + 7) // 8, dtype=torch.uint8)

    @property
    def nbytes(self) -> int:
        return self._bits.numel()

    @property
    def bits(self) -> torch.Tensor:
        """The bitmap itself (row r is bit ``r & 7`` of byte ``r >> 3``), cleared in place."""
        return self._bits

    def mark(self, ids: torch.Tensor) -> None:
        """Marks rows ``ids`` (int64, in range; repeats allowed).

        Raises:
            IndexError: an id outside the bitmap.
        """
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        load_extension()
        torch.ops.mtrains.mark_row_bits([self._bits], ids, [0, ids.numel()])

    def test(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each of rows ``ids`` (int64, in range) is marked: a bool tensor.

        Raises:
            IndexError: an id outside the bitmap.
        """
        self._check(ids)
        return ((self._bits[ids >> 3] >> (ids & 7).to(torch.uint8)) & 1).bool()

    def unmark(self, ids: torch.Tensor) -> None:
        """Clears rows ``ids`` (int64, in range; repeats allowed)."""
        self._check(ids)
        if ids.numel() == 0:
            return
        ids = torch.unique(ids)
        at, where = torch.unique(ids >> 3, return_inverse=True)
        masks = torch.zeros(at.numel(), dtype=torch.int32).index_add_(0, where, (1 << (ids & 7)).to(torch.int32))
        self._bits[at] &= ~masks.to(torch.uint8)

    def _check(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_rows):
            raise IndexError(f"row ids must be in [0, {self.num_rows})")

    def clear(self) -> None:
        self._bits.zero_()

    def count(self, start: int = 0, stop: int | None = None) -> int:
        """Marked rows in ``[start, stop)``: the whole bytes inside by their bit counts (no
        ids listed), the bytes cut by the range's ends by their ids."""
        stop = self.num_rows if stop is None else stop
        first, last = (start + 7) >> 3, stop >> 3  # the whole bytes inside [start, stop)
        if first >= last:
            return int(self.ids(start, stop).numel())
        marked = self.ids(start, first * 8).numel() + self.ids(last * 8, stop).numel()
        for b0 in range(first, last, _SCAN_BYTES):
            block = self._bits[b0 : min(last, b0 + _SCAN_BYTES)]
            if bool(block.any()):
                marked += int(_POPCOUNT[block.long()].sum())
        return int(marked)

    def ids(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The marked row ids in ``[start, stop)``, ascending int64."""
        parts = list(self._scan(start, stop))
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def _scan(self, start: int, stop: int | None):
        stop = self.num_rows if stop is None else stop
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"rows [{start}, {stop}) outside [0, {self.num_rows})")
        lo_byte = start >> 3
        for b0 in range(lo_byte, (stop + 7) >> 3, _SCAN_BYTES):
            b1 = min((stop + 7) >> 3, b0 + _SCAN_BYTES)
            block = self._bits[b0:b1]
            if not bool(block.any()):
                continue
            bits = (block.unsqueeze(1) & _BIT).ne(0).reshape(-1)
            ids = bits.nonzero().reshape(-1) + b0 * 8
            yield ids[(ids >= start) & (ids < stop)]
