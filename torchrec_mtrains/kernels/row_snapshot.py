"""RowSnapshot: a table's rows as of one moment, read while training goes on writing them.

A checkpoint selects the rows it holds when training stops for it, between steps: those
the kernel's cache holds are copied then (the cache has their newest value), the others
are read later from the tier, on another thread if the save runs in the background.
Training writes rows to the tier meanwhile: evicted cache rows, a flush. Copy-on-write
keeps the save exact: every writer calls ``before_write(ids)`` first, which copies the old
value of each selected row not read yet into a stash; the save reads each selected row
once, from the tier if no writer came first, else from the stash. Memory: two bits per
row of the table, the cached rows copied, and the rows written before the save read them.
"""

from __future__ import annotations

import threading
from typing import List, Optional, Tuple

import torch

from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.storage.types import RowStore

__all__ = ["RowSnapshot"]

# Rows the save reads per hold of the lock (a writer waits at most that long): enough to
# keep the device busy between calls.
_READ_BYTES = 8 << 20
_STASH_PARTS = 8  # stashed parts merged into one beyond this many


class RowSnapshot:
    """The rows ``selected`` marks of ``store`` (``[n, row_width]`` of ``dtype``), as of now;
    ``held``: (ascending ids, rows) of selected rows whose value now is not the store's (the
    kernel's cached copies), kept as they are.

    Thread-safety: ``before_write`` (training's writers) and ``read`` (the save) may run
    on different threads; one lock orders them per table.
    """

    def __init__(self, store: RowStore, selected: DirtyRows, row_width: int, dtype: torch.dtype,
                 held: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> None:
        self.store, self.selected = store, selected
        self._unread = DirtyRows(selected.num_rows)
        self._unread.bits.copy_(selected.bits)
        self._width, self._dtype = row_width, dtype
        self._lock = threading.Lock()
        self._stash: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (ascending ids, their rows)
        self.rows_stashed = 0
        if held is not None and held[0].numel():  # selected rows copied already (ascending ids)
            self._stash.append(held)
            copied = DirtyRows(selected.num_rows)  # many rows: one pass over the bitmap
            copied.mark(held[0])
            self._unread.bits.bitwise_and_(copied.bits.bitwise_not())

    def before_write(self, ids: torch.Tensor) -> None:
        """Keeps the old value of the rows among ``ids`` (int64) the save still has to read."""
        if ids.numel() == 0:
            return
        with self._lock:
            hit = ids[self._unread.test(ids)]
            if hit.numel() == 0:
                return
            hit = torch.unique(hit)
            self._stash.append((hit, self.store.read(hit)))
            self._unread.unmark(hit)
            self.rows_stashed += int(hit.numel())
            if len(self._stash) > _STASH_PARTS:
                self._stash = [_merged(self._stash)]

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (distinct, selected) as of the snapshot; each is read once. They
        are read in the store's fastest order (``storage_order``: the block store's log
        order), a few MiB per hold of the lock."""
        out = torch.empty((ids.numel(), self._width), dtype=self._dtype)
        order = self.store.storage_order(ids)
        if order is not None:
            ids = ids[order]
        step = max(1, _READ_BYTES // max(1, self._width * self._dtype.itemsize))
        for lo in range(0, ids.numel(), step):
            part = ids[lo : lo + step]
            at = slice(lo, lo + part.numel()) if order is None else order[lo : lo + step]
            with self._lock:
                unread = self._unread.test(part)
                if bool(unread.all()):  # the usual case: nothing written since the snapshot
                    rows = self.store.read(part)
                    self._unread.unmark(part)
                else:
                    rows = torch.empty((part.numel(), self._width), dtype=self._dtype)
                    if bool(unread.any()):
                        rows[unread] = self.store.read(part[unread])
                        self._unread.unmark(part[unread])
                    rows[~unread] = self._take(part[~unread])
            out[at] = rows
        return out

    def _take(self, ids: torch.Tensor) -> torch.Tensor:
        """The stashed rows of ``ids`` (each stashed once: a stashed row is no longer unread)."""
        rows = torch.empty((ids.numel(), self._width), dtype=self._dtype)
        found = torch.zeros(ids.numel(), dtype=torch.bool)
        for stash_ids, stash_rows in self._stash:
            at = torch.searchsorted(stash_ids, ids).clamp_(max=stash_ids.numel() - 1)
            match = stash_ids[at] == ids
            rows[match] = stash_rows[at[match]]
            found |= match
        if not bool(found.all()):
            missing = ids[~found][:5].tolist()
            raise RuntimeError(f"rows {missing} of a checkpoint's snapshot were neither unread nor stashed: "
                               "read twice, or never selected")
        return rows

    def release(self) -> Optional[int]:
        """Drops the stash (the save is over); returns the rows it had kept."""
        with self._lock:
            self._stash = []
            self._unread.clear()
            return self.rows_stashed


def _merged(parts: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor]:
    ids = torch.cat([p[0] for p in parts])
    rows = torch.cat([p[1] for p in parts])
    order = torch.argsort(ids)
    return ids[order], rows[order]
