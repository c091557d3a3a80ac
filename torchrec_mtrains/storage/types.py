"""Interfaces and value types of the storage tiers below the row cache."""

from __future__ import annotations

import abc
from typing import Dict, Optional, Self

import torch

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
