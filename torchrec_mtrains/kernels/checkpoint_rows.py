"""The kernel's rows as a checkpoint sees them: which rows changed, the tier's rows
without the cache's copies, and, for SSD tables, the block store itself (a checkpoint can
hard-link its file and record the location map instead of copying rows)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot
from torchrec_mtrains.kernels.steps import StepPath
from torchrec_mtrains.kernels.table_rows import TableRows
from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.block_store import StoreRuntimeConfig

__all__ = ["CheckpointRows"]


class CheckpointRows:
    """The checkpoint-facing row access of ``TieredEmbeddingBags`` (its methods of the
    same names document each).

    Args:
        cache: the kernel's tables and cache.
        rows: its whole-table access (overlaying cached rows, writing rows).
        steps: its step path (to drain, and to refuse a store swap while a step is pending).
        ssd_dram_cache_mb: the DRAM cache of a block store it adopts, in MiB.
    """

    def __init__(self, cache: RowCache, rows: TableRows, steps: StepPath, ssd_dram_cache_mb: float) -> None:
        self.cache, self._rows, self._steps = cache, rows, steps
        self._ssd_dram_cache_mb = ssd_dram_cache_mb

    def dirty_rows(self, table: int) -> DirtyRows:
        return self.cache.dirty[table]

    def clear_dirty(self) -> None:
        self._steps.drain()
        for d in self.cache.dirty:
            d.clear()

    def written_ids(self, table: int, start: int, stop: int) -> torch.Tensor:
        self._steps.drain()
        return self.cache.stores[table].written_ids(start, stop)

    def store_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        self.cache.check_usable()
        self._steps.drain()
        out = self.cache.stores[table].read(ids)
        self._rows.overlay_cached(table, ids, out)
        return out

    def snapshot_rows(self, table: int, selected: DirtyRows, add_cached: bool = False) -> RowSnapshot:
        cache = self.cache
        cache.check_usable()
        self._steps.drain()
        if table in cache.snapshots:
            raise RuntimeError(f"table {cache.names[table]}: a checkpoint is saving it already")
        codec = cache.codecs[table]
        # The cached copy of a row is its newest value (the tier's may be older): the
        # selected rows the cache holds are copied now, the others read from the tier.
        cached, slots = cache.cached(table)
        if add_cached:
            selected.mark(cached)
        keep = selected.test(cached)
        cached, slots = cached[keep], slots[keep]
        order = torch.argsort(cached)
        held = (cached[order], cache.slots.gather(table, slots[order]))
        snapshot = RowSnapshot(cache.stores[table], selected, codec.layout.row_width, codec.dtype, held)
        cache.snapshots[table] = snapshot
        cache.engine.set_write_guard(table, True)  # the engine's write-backs keep old rows first
        return snapshot

    def release_snapshot(self, table: int) -> None:
        snapshot = self.cache.snapshots.pop(table, None)
        self.cache.engine.set_write_guard(table, False)
        if snapshot is not None:
            snapshot.release()

    def set_store_rows(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        cache = self.cache
        codec = cache.codecs[table]
        if rows.dtype != codec.dtype or tuple(rows.shape) != (ids.numel(), codec.layout.row_width):
            raise ValueError(
                f"table {cache.names[table]}: rows must be {codec.dtype} of shape "
                f"({ids.numel()}, {codec.layout.row_width}), got {rows.dtype} {tuple(rows.shape)}"
            )
        weights, state = codec.split(rows)
        self._rows.set_rows(table, ids, weights.contiguous(), state, by_row=True)  # a virtual table's too

    def linkable_store(self, table: int) -> Optional[BlockStore]:
        store = self.cache.stores[table]
        if isinstance(store, BlockStore) and not store.stripe_paths:
            return store
        return None

    def adopt_store_file(self, table: int, source: str, ids: torch.Tensor, locations: torch.Tensor,
                         pin_tag: int) -> BlockStore:
        cache = self.cache
        cache.check_usable()
        self._steps.drain()
        if self._steps.pending:
            raise RuntimeError(f"table {cache.names[table]}: a prefetched step is pending; "
                               "adopt a store file only between steps")
        old = cache.stores[table]
        path = old.path
        cache.mover.detach(table)
        old.close()
        try:
            os.unlink(path)
            os.link(source, path)
            runtime = StoreRuntimeConfig(dram_cache_mb=self._ssd_dram_cache_mb)
            store = BlockStore.open_adopted(path, ids, locations, pin_tag, runtime=runtime)
        except (OSError, ValueError) as e:
            cache.broken = f"table {cache.names[table]}: its store file could not be replaced by {source}: {e}"
            raise
        cache.replace_store(table, store)
        cache.index.reset(table)
        cache.slots.drop_deferred(table)
        cache.dirty[table].clear()
        return store
