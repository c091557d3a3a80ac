"""Interfaces and value types of the storage tiers below the row cache."""

from __future__ import annotations

import abc
from typing import Dict, Optional, Self

import torch

from torchrec_mtrains.storage._validation import check_row_range

__all__ = ["RowStore", "CorruptionError"]


class CorruptionError(OSError):
    """Data read back from a table failed a checksum, magic or identity check.

    Raised instead of ever returning damaged rows; ``errno`` is ``EBADMSG``.
    """


class RowStore(abc.ABC):
    """A table of ``num_rows`` rows of ``dim`` weights + ``state_dim`` optimizer values.

    Every tier under the cache (DRAM tensor, SCM mmap, SSD block store) implements this.
    """

    num_rows: int
    dim: int
    state_dim: int
    dtype: torch.dtype

    @property
    def row_width(self) -> int:
        """Values per row: ``dim + state_dim``."""
        return self.dim + self.state_dim

    @abc.abstractmethod
    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Returns rows ``ids`` as a ``[len(ids), row_width]`` tensor (into ``out`` if given)."""

    @abc.abstractmethod
    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Stores ``rows[i]`` as row ``ids[i]``; for repeated ids the last one wins."""

    def exchange(
        self,
        write_ids: torch.Tensor,
        write_rows: torch.Tensor,
        read_ids: torch.Tensor,
        out: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``write(write_ids, write_rows)`` then ``read(read_ids, out)``; a store may
        overlap the two's device I/O (the block store does), but a row both written and
        read reads its new value."""
        self.write(write_ids, write_rows)
        return self.read(read_ids, out)

    def attach_to(self, mover: torch.ScriptObject, table: int) -> None:
        """Hands this store's rows to a kernel's step mover (``torch.classes.mtrains.StepMover``)
        as its table ``table``: a step's rows then move between the cache slots and this
        store in C++ (csrc/kernel/). Every built-in tier can; a store that cannot raises
        TypeError. The mover keeps what it was given alive until ``mover.detach(table)``,
        which its kernel calls before closing the store."""
        raise TypeError(f"{type(self).__name__} cannot hand its rows to a step mover")

    def count_moved(self, rows_read: int, rows_written: int, lazy_rows: int) -> None:
        """Adds rows a step mover read from and wrote to this store (``lazy_rows`` of those
        read never written: made from their initial value) to its ``stats()`` counters. A
        store that counts its own I/O, as the block store does, ignores this."""

    def storage_order(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """The permutation of ``ids`` in which this store reads them fastest (int64
        positions), or None where ascending ids are as fast as any order: this default,
        right for stores that keep row ``i`` at its own place (DRAM, SCM). The block store
        orders them by their place in its log."""
        return None

    def written_ids(self, start: int, stop: int) -> torch.Tensor:
        """The ids in ``[start, stop)`` of rows that may differ from their initial value
        (rows written since the table was created); every row not listed reads as its lazy
        initial value (``lazy_init_rows`` of the table's seed and the id). Lets a checkpoint
        save only the rows that hold data.

        This default lists every row (conservative: right for a store that does not track
        writes); stores that do track them override it. Memory is O(stop - start), whatever
        the table's size, so callers walk a large table in ranges.

        Args:
            start: first row id of the range.
            stop: one past its last row id; ``0 <= start <= stop <= num_rows``.

        Returns:
            An ascending 1-D int64 tensor of row ids.

        Raises:
            ValueError: ``start`` or ``stop`` is not an integer.
            IndexError: the range is not within ``[0, num_rows]``.
        """
        check_row_range(self._table_label(), start, stop, self.num_rows)
        return torch.arange(start, stop, dtype=torch.int64)

    def _table_label(self) -> str:
        """What error messages call this table: its file, else its name, else its class."""
        for attr in ("path", "name"):
            label = getattr(self, attr, None)
            if isinstance(label, str) and label:
                return label
        return type(self).__name__

    @abc.abstractmethod
    def flush(self) -> None:
        """Makes every written row durable."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flushes and releases the store."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def stats(self) -> Dict[str, float]:
        """Counters of rows and bytes moved, cache hits, latencies."""
