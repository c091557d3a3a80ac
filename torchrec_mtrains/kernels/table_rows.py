"""TableRows: whole tables of a kernel through every tier -- the dirty cached rows flushed
to the stores, rows overwritten on the tier and in the cache, and rows read through the
tier overlaid with the cache's newer copies."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch

from torchrec_mtrains.kernels.batch import check_index_tensor
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["TableRows"]

_READ_CHUNK_ROWS = 1 << 16  # rows per store read when materialising a whole table
_FLUSH_CHUNK_ROWS = 1 << 16  # dirty rows per store write when flushing the cache


class TableRows:
    """Row access of ``TieredEmbeddingBags`` beyond a step (its ``flush``, ``set_rows``,
    ``read_rows``, ``split_*`` methods document each).

    Args:
        cache: the kernel's tables and cache.
        drain: puts the rows of every queued step in their slots (the step path's), called
            before the cache's slots or the stores are read or written.
    """

    def __init__(self, cache: RowCache, drain: Callable[[], None]) -> None:
        self.cache, self._drain = cache, drain

    def flush(self, steps_done: bool, durable: bool = True, tables: Optional[Sequence[int]] = None) -> None:
        cache = self.cache
        cache.check_usable()
        self._drain()
        run = cache.run
        if not run.unflushed:
            return  # nothing changed since a flush that left every row on the tier
        live = max(0, run.last_forward_step + (1 if steps_done else 0))
        for t in range(len(cache.specs)) if tables is None else tables:
            rows, slots = cache.index.take_dirty(t, live)
            ready = cache.slots.in_tbe(t, slots)
            rows, slots = rows[ready], slots[ready]
            with cache.naming(t):
                # In chunks: a cache of millions of dirty rows would otherwise be copied
                # whole (and queued whole in the store) at once.
                for start in range(0, rows.numel(), _FLUSH_CHUNK_ROWS):
                    chunk = slice(start, start + _FLUSH_CHUNK_ROWS)
                    if t in cache.snapshots:
                        cache.snapshots[t].before_write(rows[chunk])
                    cache.stores[t].write(rows[chunk], cache.slots.gather(t, slots[chunk]))
                    cache.counters[t].rows_written_back += rows[chunk].numel()
                if durable:
                    cache.stores[t].flush()
            fault_point("flush.table")
        # Else rows of a step still running stay dirty; and a flush that left durability to
        # the tiers leaves it to the next durable one.
        run.unflushed = not (steps_done and durable and tables is None)

    def set_rows(self, table: int, ids: torch.Tensor, weights: torch.Tensor,
                 optimizer_state: Optional[torch.Tensor], by_row: bool = False) -> None:
        """``by_row``: ``ids`` are a virtual table's rows (a checkpoint's restore)."""
        cache = self.cache
        cache.check_usable()
        cache.check_table(table)
        if not by_row:
            self._check_dense(table, "set_rows")
        name, (rows_t, dim) = cache.names[table], cache.specs[table]
        codec = cache.codecs[table]
        ids = check_index_tensor("ids", torch.as_tensor(ids))
        n = ids.numel()
        if ids.dim() != 1 or (n and (int(ids.min()) < 0 or int(ids.max()) >= rows_t)):
            raise IndexError(f"table {name}: ids must be 1-D row ids in [0, {rows_t})")
        if weights.dtype != codec.dtype or tuple(weights.shape) != (n, dim):
            raise ValueError(f"table {name}: weights must be {codec.dtype} of shape ({n}, {dim})")
        state_shape = codec.layout.state_shape(n)
        if state_shape is None:  # SGD: no state
            state = None
        elif optimizer_state is None:
            state = torch.zeros(state_shape, dtype=torch.float32)
        elif optimizer_state.dtype != torch.float32 or tuple(optimizer_state.shape) != state_shape:
            raise ValueError(f"table {name}: optimizer_state must be float32 of shape {state_shape}")
        else:
            state = optimizer_state
        rows = weights if state is None else torch.cat(
            [weights, state.reshape(n, -1).contiguous().view(codec.dtype)], dim=1
        )
        self._write(table, ids, rows.contiguous())

    def _write(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Store ``rows`` of ``ids`` to the tier, the cached copies and the deferred loads."""
        cache = self.cache
        self._drain()
        cache.run.unflushed = True
        if table in cache.snapshots:
            cache.snapshots[table].before_write(ids)
        cache.stores[table].write(ids, rows)
        cache.dirty[table].mark(ids)
        # The new row of each given id, the last occurrence winning as in the store.
        order = torch.argsort(ids, stable=True)
        sorted_ids = ids[order]

        def new_rows_of(row_ids: torch.Tensor) -> torch.Tensor:
            return rows[order[torch.searchsorted(sorted_ids, row_ids, right=True) - 1]]

        cached_rows, slots = cache.cached(table)
        hit = torch.isin(cached_rows, ids)
        if bool(hit.any()):
            cache.slots.scatter(table, slots[hit], new_rows_of(cached_rows[hit]))
        for d in cache.slots.deferred:  # rows waiting for the TBE to grow
            if d.table == table:
                hit = torch.isin(d.ids, ids)
                if bool(hit.any()):
                    d.rows[hit] = new_rows_of(d.ids[hit])

    def full_rows(self, t: int, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Rows ``[start, stop)`` of table t as store rows: read through the tier, overlaid
        with the cached rows."""
        cache = self.cache
        self._drain()
        stop = cache.specs[t][0] if stop is None else stop
        codec = cache.codecs[t]
        out = torch.empty((stop - start, codec.layout.row_width), dtype=codec.dtype)
        for lo in range(start, stop, _READ_CHUNK_ROWS):
            ids = torch.arange(lo, min(stop, lo + _READ_CHUNK_ROWS))
            out[lo - start : lo - start + ids.numel()] = cache.stores[t].read(ids)
        self.overlay_cached(t, torch.arange(start, stop), out)
        return out

    def overlay_cached(self, t: int, ids: torch.Tensor, out: torch.Tensor) -> None:
        """Overwrites ``out`` (rows ``ids`` of table t as the tier holds them) with the cached
        copy of each row the cache holds, which may be newer. Rows of deferred (overflow)
        loads came from the tier, which is still current for them."""
        cache = self.cache
        if not cache.run.unflushed:
            return  # the tier holds every row as the cache does
        cached, slots = cache.cached(t)
        hit = torch.isin(ids, cached)
        if bool(hit.any()):
            order = torch.argsort(cached)
            where = order[torch.searchsorted(cached[order], ids[hit])]
            with torch.no_grad():
                out[hit] = cache.slots.gather(t, slots[where])

    def read_rows(self, table: int, start: int, stop: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        cache = self.cache
        cache.check_usable()
        cache.check_table(table)
        self._check_dense(table, "read_rows")
        rows_t = cache.specs[table][0]
        if not 0 <= start <= stop <= rows_t:
            raise IndexError(f"table {cache.names[table]}: rows [{start}, {stop}) outside [0, {rows_t})")
        weights, state = cache.codecs[table].split(self.full_rows(table, start, stop))
        if state is None:  # SGD: no state
            return weights.clone(), None
        return weights.clone(), state.clone()

    def _check_dense(self, table: int, what: str) -> None:
        """A virtual table's rows are keyed by id: row numbers mean nothing to its users."""
        if table in self.cache.virtual.tables:
            raise ValueError(f"table {self.cache.names[table]} is a virtual table: {what} takes row numbers; "
                             "read its rows by id with read_ids()")

    def split_embedding_weights(self) -> List[torch.Tensor]:
        for t in self.cache.virtual.tables:
            self._check_dense(t, "split_embedding_weights")
        codecs = self.cache.codecs
        return [codecs[t].split(self.full_rows(t))[0].clone() for t in range(len(codecs))]

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        for t in self.cache.virtual.tables:
            self._check_dense(t, "split_optimizer_states")
        codecs = self.cache.codecs
        if codecs[0].layout.state_values == 0:
            return []
        out = []
        for t, codec in enumerate(codecs):
            state = codec.split(self.full_rows(t))[1]
            parts = codec.layout.split_state(state.reshape(state.shape[0], -1))
            out.append([part.clone() for part in parts])
        return out
