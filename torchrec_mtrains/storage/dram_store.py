"""DramStore: a table held whole in a host tensor (the DRAM tier)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from torchrec_mtrains.storage._validation import (
    as_ids,
    check_init_range,
    check_int,
    check_rows,
    id_range_checked_by_op,
)
from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.huge_pages import huge_page_zeros
from torchrec_mtrains.storage.lazy_init import lazy_init_rows
from torchrec_mtrains.storage.types import RowStore

__all__ = ["DramStore"]

_INIT_CHUNK_ROWS = 1 << 16


_NO_WORDS = torch.empty(0, dtype=torch.uint8)  # every row is materialised: no per-row marks


class DramStore(RowStore):
    """All rows in one ``[num_rows, dim + state_dim]`` host tensor, initialised with the
    same deterministic values a never-written BlockStore row reads as."""

    def __init__(
        self,
        num_rows: int,
        dim: int,
        state_dim: int = 1,
        dtype: torch.dtype = torch.float32,
        init_range: Tuple[float, float] = (-0.01, 0.01),
        seed: int = 0,
        name: str = "dram table",
    ) -> None:
        check_int("num_rows", num_rows, 1, 2**40)
        check_int("dim", dim, 1, 2**20)
        check_int("state_dim", state_dim, 0, 2**20)
        check_init_range(init_range)
        load_extension()
        self.num_rows, self.dim, self.state_dim, self.dtype = num_rows, dim, state_dim, dtype
        self.name = name
        # Rows move between this table and the cache at random: huge pages (huge_pages.py).
        self.data = huge_page_zeros((num_rows, dim + state_dim), dtype)
        for start in range(0, num_rows, _INIT_CHUNK_ROWS):
            ids = torch.arange(start, min(num_rows, start + _INIT_CHUNK_ROWS))
            self.data[start : start + ids.numel()] = lazy_init_rows(
                ids, dim, state_dim, init_range, seed, dtype
            )
        self._rows_read = self._rows_written = 0

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        ids = as_ids(self.name, ids)
        if out is not None:
            check_rows(self.name, out, ids.numel(), self.row_width, self.dtype, "out")
        with id_range_checked_by_op(self.name, ids, self.num_rows):
            rows = torch.ops.mtrains.pack_rows(self.data, None, ids, self.dtype)
        self._rows_read += ids.numel()
        return out.copy_(rows) if out is not None else rows

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        ids = as_ids(self.name, ids)
        check_rows(self.name, rows, ids.numel(), self.row_width, self.dtype, "rows")
        # Rows are copied in order, so for a repeated id the last one wins; every id is
        # checked before any row is written.
        with id_range_checked_by_op(self.name, ids, self.num_rows):
            torch.ops.mtrains.unpack_rows(rows.contiguous(), ids, self.data, None)
        self._rows_written += ids.numel()

    def attach_to(self, mover: torch.ScriptObject, table: int) -> None:
        mover.set_mapped(table, self.data, _NO_WORDS, self.dim, self.state_dim, 0, 0.0, 0.0, self.name, 0)

    def count_moved(self, rows_read: int, rows_written: int, lazy_rows: int) -> None:
        self._rows_read += rows_read
        self._rows_written += rows_written

    def flush(self) -> None:
        """Nothing to persist: DRAM is volatile (checkpoints save it)."""

    def close(self) -> None:
        self.data = torch.empty(0, self.row_width, dtype=self.dtype)

    def stats(self) -> Dict[str, float]:
        return {"rows_read": float(self._rows_read), "rows_written": float(self._rows_written)}
