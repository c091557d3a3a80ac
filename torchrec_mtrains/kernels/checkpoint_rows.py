"""The kernel's rows as a checkpoint sees them: which rows changed, the tier's rows
without the cache's copies, and, for SSD tables, the block store itself (a checkpoint can
hard-link its file and record the location map instead of copying rows)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.block_store import StoreRuntimeConfig

__all__ = ["CheckpointRows"]


class CheckpointRows:
    """Mixin of ``TieredEmbeddingBags``: its checkpoint-facing row access."""

    def dirty_rows(self, table: int) -> DirtyRows:
        """The rows of ``table`` that training forwards looked up (so may have changed) or
        ``set_rows`` wrote since the last ``clear_dirty()``; after ``flush()`` their values
        are on the tier."""
        return self._dirty[table]

    def clear_dirty(self) -> None:
        """Forgets which rows were written (a checkpoint now holds them)."""
        self._drain()
        for d in self._dirty:
            d.clear()

    def written_ids(self, table: int, start: int, stop: int) -> torch.Tensor:
        """Ids in ``[start, stop)`` of the rows of ``table`` that may differ from their
        initial value (``lazy_init_rows`` of ``store_seed(table)``) once ``flush()`` wrote
        the cache's changes to the tier: those the tier holds as written."""
        self._drain()
        return self._stores[table].written_ids(start, stop)

    def store_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of ``table`` as the tier stores them (``[n, row_width]``: weights,
        then the optimizer state's bytes), read through the tier and the cache."""
        self._check_usable()
        self._drain()
        out = self._stores[table].read(ids)
        self._overlay_cached(table, ids, out)
        return out

    def set_store_rows(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrites rows ``ids`` of ``table`` with rows as ``store_rows`` returns them."""
        codec = self._codecs[table]
        if rows.dtype != codec.dtype or tuple(rows.shape) != (ids.numel(), codec.layout.row_width):
            raise ValueError(
                f"table {self.table_names[table]}: rows must be {codec.dtype} of shape "
                f"({ids.numel()}, {codec.layout.row_width}), got {rows.dtype} {tuple(rows.shape)}"
            )
        weights, state = codec.split(rows)
        self.set_rows(table, ids, weights.contiguous(), state)

    def linkable_store(self, table: int) -> Optional[BlockStore]:
        """The block store of ``table`` when a checkpoint can link its file instead of
        copying its rows (an SSD table on one file: a striped log names its other files by
        path, which a link cannot carry); else None. Flush first: the store then holds
        every row."""
        store = self._stores[table]
        if isinstance(store, BlockStore) and not store.stripe_paths:
            return store
        return None

    def adopt_store_file(self, table: int, source: str, ids: torch.Tensor, locations: torch.Tensor,
                         pin_tag: int) -> BlockStore:
        """Makes the file ``source`` (a checkpoint's link to an earlier store file of this
        table) the table's store, its rows being exactly the location map ``ids`` ->
        ``locations``, and pins them under ``pin_tag``; the table's cached rows are dropped
        unwritten. The current store is closed and its path linked to ``source`` instead."""
        self._check_usable()
        self._drain()
        if self._pending:
            raise RuntimeError(f"table {self.table_names[table]}: a prefetched step is pending; "
                               "adopt a store file only between steps")
        old = self._stores[table]
        path = old.path
        old.close()
        try:
            os.unlink(path)
            os.link(source, path)
            runtime = StoreRuntimeConfig(dram_cache_mb=self.config.ssd_dram_cache_mb)
            store = BlockStore.open_adopted(path, ids, locations, pin_tag, runtime=runtime)
        except (OSError, ValueError) as e:
            self._broken = f"table {self.table_names[table]}: its store file could not be replaced by {source}: {e}"
            raise
        self._stores[table] = store
        self._index.reset(table)
        self._deferred = [d for d in self._deferred if d.table != table]
        self._dirty[table].clear()
        return store
