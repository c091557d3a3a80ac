"""Virtual tables: every id its own row, made on first lookup and evicted by a policy.

A virtual table's ids are keys in a space far larger than the table (raw 64-bit ids, say),
not row numbers. The kernel under it -- step mover, stores -- works on dense rows as for any
table; the table's ``IdIndex`` (C++, kernel/id_index.h) gives each live id its own row, so no
two ids share one. The table's cache is keyed by the ids themselves: a step's hits find their
slots (and rows) without the id index, which the plan consults only for the ids the cache
misses (``torch.classes.mtrains.VirtualIds``, kernel/virtual_ids.h, on the engine's plan
thread, in step order):

- an id without a row takes a free one; that row is *fresh* until the step mover first
  loads it into a cache slot, which then makes the id's initial value -- ``lazy_init_rows``
  of (seed, id + id_offset), exactly a dense table's row of that number -- instead of
  reading the tier, which still holds the row's previous id (kernel/virtual_tier_rows.h).
  The slot is kept dirty, so the new row reaches the tier;
- an eviction pass runs once a step took the live ids past the policy's trigger, or when a
  step's new ids would not fit the table's rows: it removes the ids the policy names (count
  with decay, time since last use, or both, or the L2 norm of the row's weights, as FBGEMM's
  policies do), never those of a step still planned or running, and drops them from the
  cache unwritten. An evicted id that comes back is a fresh row again. The L2-norm pass reads
  rows' weights, so it runs here, in Python, called by the plan (``_norm_pass``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from torchrec_mtrains.storage.status import raise_for_status

__all__ = ["EvictionSpec", "VirtualRows", "VirtualTableFull", "VirtualTableSpec"]

_MAX_ROWS = 2**32 - 2  # the index's row numbers are 32-bit
# NormEviction::evict of kernel/virtual_ids.h: (context, step, table, keep rows, n) -> ids removed, -1: failed.
_NORM_PASS = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                              ctypes.c_int64)

WeightReader = Callable[[int, torch.Tensor], Iterable[torch.Tensor]]
"""(table, rows) -> that table's current weights of ``rows``, in blocks (``set_weight_reader``)."""


class VirtualTableFull(RuntimeError):
    """Every row of a virtual table holds a live id the policy keeps, and a step brings more."""


@dataclasses.dataclass(frozen=True)
class EvictionSpec:
    """When and which ids a virtual table evicts (FBGEMM's rules).

    Args:
        trigger_ids: an eviction pass runs when a step would take the live ids past this
            (0: only when the table's rows run out).
        count_threshold: evict ids whose access count, multiplied by ``decay_rate`` at each
            pass, is below this (0: the count does not decide).
        decay_rate: in (0, 1].
        ttl_seconds: evict ids not looked up for longer than this (0: time does not decide).
            With ``count_threshold`` too, only ids both rules name go.
        l2_threshold: evict ids whose row's weights have an L2 norm below this, as FBGEMM's
            ``L2WeightBasedEvict`` (0: the norm does not decide). It reads the rows' weights
            at each pass (no metadata is kept), and is not combined with the count or time
            rules (FBGEMM has no such mix).
        clock: seconds now (time.time); a test passes its own.
    """

    trigger_ids: int = 0
    count_threshold: float = 0.0
    decay_rate: float = 1.0
    ttl_seconds: int = 0
    l2_threshold: float = 0.0
    clock: Callable[[], float] = dataclasses.field(default=time.time, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.trigger_ids, bool) or not isinstance(self.trigger_ids, int) or self.trigger_ids < 0:
            raise ValueError(f"EvictionSpec: trigger_ids={self.trigger_ids!r} must be an int >= 0")
        if isinstance(self.ttl_seconds, bool) or not isinstance(self.ttl_seconds, int) or self.ttl_seconds < 0:
            raise ValueError(f"EvictionSpec: ttl_seconds={self.ttl_seconds!r} must be an int >= 0")
        if not (isinstance(self.count_threshold, (int, float)) and math.isfinite(self.count_threshold)
                and self.count_threshold >= 0):
            raise ValueError(f"EvictionSpec: count_threshold={self.count_threshold!r} must be a number >= 0")
        if not (isinstance(self.decay_rate, (int, float)) and 0 < self.decay_rate <= 1):
            raise ValueError(f"EvictionSpec: decay_rate={self.decay_rate!r} must be in (0, 1]")
        if not (isinstance(self.l2_threshold, (int, float)) and not isinstance(self.l2_threshold, bool)
                and math.isfinite(self.l2_threshold) and self.l2_threshold >= 0):
            raise ValueError(f"EvictionSpec: l2_threshold={self.l2_threshold!r} must be a number >= 0")
        if self.l2_threshold > 0 and (self.count_threshold > 0 or self.ttl_seconds > 0):
            raise ValueError(f"EvictionSpec: l2_threshold={self.l2_threshold!r} does not combine with "
                             f"count_threshold={self.count_threshold!r} or ttl_seconds={self.ttl_seconds!r}: "
                             "FBGEMM's L2-norm policy is a rule of its own")
        if not callable(self.clock):
            raise ValueError("EvictionSpec: clock must be callable")

    @property
    def evicts(self) -> bool:
        return self.count_threshold > 0 or self.ttl_seconds > 0 or self.l2_threshold > 0


@dataclasses.dataclass(frozen=True)
class VirtualTableSpec:
    """A kernel table whose ids are keys: ids in ``[0, id_space)``, rows made on first
    lookup. The table's ``num_rows`` (its embedding spec) is how many live ids it holds.

    Args:
        id_space: ids lie in ``[0, id_space)`` (a row-wise shard's ids are local to it).
        id_offset: added to an id to make the global id whose initial value its row takes
            (the shard's first id), so a row's initial value does not depend on sharding.
        eviction: the policy (default: none; the table then holds at most ``num_rows`` ids).
    """

    id_space: int
    id_offset: int = 0
    eviction: EvictionSpec = EvictionSpec()

    def __post_init__(self) -> None:
        for name in ("id_space", "id_offset"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "id_space" else 0) or v >= 2**63:
                raise ValueError(f"VirtualTableSpec: {name}={v!r} must be an int in [{int(name == 'id_space')}, 2^63)")
        if self.id_offset + self.id_space > 2**63:
            raise ValueError(f"VirtualTableSpec: ids up to {self.id_offset + self.id_space} do not fit int64")
        if not isinstance(self.eviction, EvictionSpec):
            raise ValueError("VirtualTableSpec: eviction must be an EvictionSpec")


class _Table:
    """One virtual table's index and spec."""

    def __init__(self, number: int, name: str, spec: VirtualTableSpec, rows: int) -> None:
        if not 1 <= rows <= _MAX_ROWS:
            raise ValueError(f"virtual table {name}: {rows} rows; it holds between 1 and 2^32 - 2")
        ev = spec.eviction
        self.number, self.name, self.spec, self.rows = number, name, spec, rows
        self.index = torch.classes.mtrains.IdIndex(rows, ev.count_threshold > 0, ev.ttl_seconds > 0)
        # A test's own clock (else the C++ side reads the wall clock itself).
        self.given_clock = ev.clock is not time.time


class VirtualRows:
    """The virtual tables of one kernel (``tables``: kernel table -> its ``_Table``).

    Args:
        specs: per kernel table, its VirtualTableSpec or None (a dense table).
        rows: per kernel table, its rows (a virtual table's live-id capacity).
        names: the tables' names (errors, stats).
        cache_index: the kernel's KernelCacheIndex, whose virtual tables are keyed by id.
    """

    # Reads rows' weights for the L2-norm policy: the kernel's, given by set_weight_reader.
    _read_weights: Optional[WeightReader] = None

    def __init__(self, specs: Sequence[Optional[VirtualTableSpec]], rows: Sequence[int], names: Sequence[str],
                 cache_index: torch.ScriptObject) -> None:
        self.tables: Dict[int, _Table] = {
            t: _Table(t, names[t], spec, rows[t]) for t, spec in enumerate(specs) if spec is not None}
        self._cache_index = cache_index
        self._errors: Dict[int, BaseException] = {}
        self._errors_lock = threading.Lock()
        # Kept alive with this object: the C++ side holds only its address.
        self._norm_callback = _NORM_PASS(self._norm_pass)
        by_norm = any(t.spec.eviction.l2_threshold > 0 for t in self.tables.values())
        address = ctypes.cast(self._norm_callback, ctypes.c_void_p).value if by_norm else 0
        self.ids = torch.classes.mtrains.VirtualIds(cache_index, address or 0)
        for t, table in self.tables.items():
            ev = table.spec.eviction
            self.ids.add(t, table.name, table.index, ev.trigger_ids, float(ev.decay_rate),
                         float(ev.count_threshold), ev.ttl_seconds, ev.l2_threshold > 0, not table.given_clock)
        self._given_clocks = [table for table in self.tables.values() if table.given_clock]

    def __bool__(self) -> bool:
        return bool(self.tables)

    def id_bounds(self, num_rows: Sequence[int]) -> List[int]:
        """Each table's bound on ids: a virtual table's id space, a dense table's rows."""
        return [self.tables[t].spec.id_space if t in self.tables else n for t, n in enumerate(num_rows)]

    def attach(self, mover: torch.ScriptObject, t: int, seed: int, init_range: Tuple[float, float], dim: int,
               state_dim: int, dtype: torch.dtype) -> None:
        """Makes table t's tier in ``mover`` a virtual one (after each attach of a store)."""
        table = self.tables[t]
        raise_for_status(mover.wrap_virtual(t, table.index, seed, float(init_range[0]), float(init_range[1]), dim,
                                            state_dim, dtype, table.spec.id_offset))

    def read_clocks(self) -> None:
        """Gives the next steps the seconds of the tables with a clock of their own (a
        test's); the others read the wall clock in C++."""
        for table in self._given_clocks:
            self.ids.set_now(table.number, int(table.spec.eviction.clock()))

    def take_error(self, step: int) -> Optional[BaseException]:
        """The exception the L2-norm pass raised while planning ``step`` (once)."""
        with self._errors_lock:
            return self._errors.pop(step, None)

    def _norm_pass(self, _ctx, step: int, t: int, keep: int, n: int) -> int:
        """The L2-norm policy's pass over table t, keeping the rows ``keep[0..n)`` (the live
        steps'), called by the plan: the ids removed, or -1 (the error waits for the step)."""
        try:
            keep_rows = torch.frombuffer((ctypes.c_int64 * n).from_address(keep), dtype=torch.int64).clone() \
                if n else torch.empty(0, dtype=torch.int64)
            gone = self._evict_by_l2_norm(self.tables[t], keep_rows)
            if gone.numel():  # their rows now belong to no id: dropped from the cache unwritten
                self._cache_index.forget(t, gone)
            return int(gone.numel())
        except BaseException as e:  # raised by the training thread when it takes the step
            with self._errors_lock:
                self._errors[step] = e
            return -1

    def set_weight_reader(self, read_weights: WeightReader) -> None:
        """Gives the L2-norm policy its rows' weights: ``read_weights(t, rows)`` yields table
        t's current weights of ``rows`` (kernel rows of live ids in no live step), ``[n, dim]``
        blocks of consecutive rows, in order. It is called during a pass, on the plan thread
        (the kernel's ``RowWeights``)."""
        self._read_weights = read_weights

    def _evict_by_l2_norm(self, table: _Table, keep: torch.Tensor) -> torch.Tensor:
        """FBGEMM's L2WeightBasedEvict: removes the live ids, except those holding rows in
        ``keep``, whose row's weights have an L2 norm (computed in float32) below the
        threshold; returns those ids. Memory: the live (id, row) pairs and one block of rows."""
        threshold = table.spec.eviction.l2_threshold
        if self._read_weights is None:
            raise RuntimeError(f"virtual table {table.name}: its L2-norm eviction reads rows' weights, and no "
                               "reader was given (VirtualRows.set_weight_reader)")
        ids, rows = table.index.entries()
        if keep.numel():
            candidate = ~torch.isin(rows, keep)
            ids, rows = ids[candidate], rows[candidate]
        chosen: List[torch.Tensor] = []
        done = 0
        for weights in self._read_weights(table.number, rows):
            n = weights.shape[0]
            norms = torch.linalg.vector_norm(weights.to(torch.float32), dim=1)
            chosen.append(ids[done: done + n][norms < threshold])
            done += n
        if done != rows.numel():
            raise RuntimeError(f"virtual table {table.name}: the weight reader gave {done} rows of {rows.numel()}")
        # Counts the pass in the index's stats (a rule naming no id removes none).
        table.index.evict(1.0, 0.0, 0, 0, keep)
        gone = torch.cat(chosen) if chosen else ids[:0]
        table.index.remove(gone)
        return gone

    def find(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """Table t's rows of ``ids`` (-1 where an id has none); changes nothing."""
        return self.tables[t].index.find(ids)

    def entries(self, t: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ids, rows) of table t's live ids, by row."""
        return self.tables[t].index.entries()

    def metadata(self, t: int, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(access counts fp32, last-use seconds int64) of table t's ``rows`` (0 where the
        policy keeps none)."""
        counts, times = self.tables[t].index.metadata(rows)
        return counts, times.to(torch.int64)

    def next_pass_at(self, t: int) -> int:
        """Table t's live ids at which its next eviction pass may run."""
        return self.ids.next_pass_at(t)

    def restore(self, t: int, ids: torch.Tensor, counts: torch.Tensor, times: torch.Tensor, replay: int,
                next_pass_at: Optional[int]) -> torch.Tensor:
        """Makes table t hold exactly ``ids`` (distinct, in its id space), id i in row i,
        with that metadata; returns the rows. The rows' bytes are the caller's to write.
        ``replay``: steps the saved run had mapped but not computed; ``next_pass_at``: the
        saved shard's (None: as after a pass now). No step may be pending.

        Raises:
            ValueError: more ids than the table's rows, naming it.
        """
        table = self.tables[t]
        if ids.numel() > table.rows:
            raise ValueError(f"virtual table {table.name}: the checkpoint holds {ids.numel()} live ids for this "
                             f"shard, more than its {table.rows} rows; give it more (TieredParams.virtual_rows)")
        old_ids, _ = table.index.entries()
        if old_ids.numel():  # the ids it held: dropped from the cache unwritten
            self._cache_index.forget(table.number, old_ids)
        rows = torch.arange(ids.numel(), dtype=torch.int64)
        raise_for_status(table.index.assign(ids.to(torch.int64), rows, counts.to(torch.float32),
                                            times.clamp(0, 2**32 - 1).to(torch.int64)))
        self.ids.restored(t, max(0, int(replay)), -1 if next_pass_at is None else int(next_pass_at))
        return rows

    def stats(self, t: int, row_bytes: int) -> Dict[str, float]:
        """Table t's live ids, index and metadata bytes (per live id, and per row ever used:
        the index keeps its peak's size after an eviction pass), evictions."""
        table = self.tables[t]
        s = {k: float(v) for k, v in dict(table.index.stats()).items()}
        live = max(1.0, s["live_ids"])
        s["index_bytes_per_live_id"] = s["index_bytes"] / live
        s["index_bytes_per_row_used"] = s["index_bytes"] / max(1.0, s["rows_used"])
        s["metadata_bytes_per_live_id"] = s["metadata_bytes"] / live
        s["tier_bytes_of_live_ids"] = s["live_ids"] * row_bytes
        # A hit is found by its id in the cache; only misses are looked up in the index.
        s["ids_found_in_cache"], s["id_lookups"] = (float(v) for v in self.ids.lookups(t))
        return s
