"""RowCache: a kernel's tables behind their row cache, as the parts of
``TieredEmbeddingBags`` share them: the step path (``steps.py``), whole-table access
(``table_rows.py``) and the checkpoint's row access (``checkpoint_rows.py``).

These are plain objects, not ``nn.Module`` attributes: a module attribute assignment costs
microseconds (``Module.__setattr__``), which every step would pay for each counter.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.row_codec import RowCodec
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot
from torchrec_mtrains.kernels.slots import CacheSlots
from torchrec_mtrains.kernels.virtual_rows import VirtualRows
from torchrec_mtrains.storage import RowStore
from torchrec_mtrains.types import Tier

__all__ = ["RowCache", "RunState", "TableCounters"]


class RunState:
    """The scalars the Python side of a step updates (the step engine counts the rest)."""

    __slots__ = ("last_forward_step", "unflushed")

    def __init__(self) -> None:
        self.last_forward_step = -1
        # False once a flush left the tiers holding every row as the cache has it; any
        # training step, write-back or set_rows makes it True again.
        self.unflushed = True


@dataclasses.dataclass
class TableCounters:
    """Rows written to a table's tier outside the step engine (flush, set_rows)."""

    rows_written_back: int = 0


class RowCache:
    """Per table (by index): ``names``, ``tiers``, ``specs`` (``(num_rows, dim)``),
    ``codecs``, backing ``stores``, ``counters`` and ``dirty`` rows; over all tables: the
    cache ``index`` (one C++ object plans every table's step), the ``slots`` (the TBE), the
    step ``mover`` (one C++ object moves every table's rows between slots and stores), the
    step ``engine`` (set by the kernel once made: it runs the steps over index and mover) and
    the ``run`` state. ``broken`` says why once the cache may no longer match the tiers;
    ``closed`` is set by the kernel's ``close()``.

    ``stores`` is the list the kernel's exit hook closes: a store swapped in (a checkpoint's
    adopted file) replaces its entry in place (``replace_store``). ``dirty`` holds the rows trained (or set)
    since the last ``clear_dirty()``, what a differential checkpoint saves: marked as a
    training forward looks them up, so rows a prefetch loaded for a step not yet computed
    are not among them.

    ``virtual`` holds the virtual tables (``virtual_rows.py``): their ids are turned into
    rows before a step is planned, so everything else sees rows; ``id_bounds`` bounds each
    table's ids (a virtual table's id space, else its rows). ``tier_wrappers`` make a
    virtual table's tier in the mover virtual again after a store is attached.
    """

    def __init__(self, names: Sequence[str], tiers: Sequence[Tier], specs: Sequence[Tuple[int, int]],
                 codecs: Sequence[RowCodec], stores: List[RowStore], index: torch.ScriptObject,
                 slots: CacheSlots, mover: torch.ScriptObject, virtual: VirtualRows,
                 tier_wrappers: Dict[int, Callable[[], None]]) -> None:
        self.names, self.tiers, self.specs = names, tiers, specs
        self.codecs, self.stores, self.index, self.slots = codecs, stores, index, slots
        self.mover = mover
        self.engine: Optional[torch.ScriptObject] = None
        self.virtual, self.tier_wrappers = virtual, tier_wrappers
        self.id_specs = list(zip(virtual.id_bounds([rows for rows, _ in specs]), [dim for _, dim in specs]))
        self.run = RunState()
        self.counters = [TableCounters() for _ in specs]
        self.dirty = [DirtyRows(rows) for rows, _ in specs]
        self.dirty_bits = [d.bits for d in self.dirty]  # the per-step marking call's argument
        # Tables a checkpoint is saving in the background: every write to their tier first
        # calls the snapshot's before_write (copy-on-write, row_snapshot.py).
        self.snapshots: Dict[int, RowSnapshot] = {}
        # Per table: the engine's rows (loaded, written back, made lazily) its store has counted.
        self._store_counted = [(0.0, 0.0, 0.0) for _ in specs]
        self.broken: Optional[str] = None
        self.closed = False

    def count_moved(self, t: int, engine_counters: Optional[Dict[str, float]] = None) -> None:
        """Adds the rows the step engine moved for table t since the last call to its store's
        ``stats()`` counters (``RowStore.count_moved``); ``engine_counters``: the engine's
        ``table_counters(t)`` when the caller has them already."""
        e = dict(self.engine.table_counters(t)) if engine_counters is None else engine_counters
        now = (e["rows_loaded"], e["rows_written_back"], e["lazy_rows"])
        before, self._store_counted[t] = self._store_counted[t], now
        self.stores[t].count_moved(*(int(a - b) for a, b in zip(now, before)))

    def replace_store(self, t: int, store: RowStore) -> None:
        """Table t's rows now live in ``store`` (the old one is closed by the caller)."""
        self.stores[t] = store
        store.attach_to(self.mover, t)
        if t in self.tier_wrappers:
            self.tier_wrappers[t]()

    def check_usable(self) -> None:
        """Raises ValueError once closed, RuntimeError once broken."""
        if self.closed:
            raise ValueError("TieredEmbeddingBags is closed")
        if self.broken is not None:
            raise RuntimeError(
                f"TieredEmbeddingBags is unusable: {self.broken}; the cache may no longer match "
                "the tier. Rebuild the module and restore the last checkpoint."
            )

    def check_table(self, table: int) -> None:
        """Raises IndexError unless ``table`` is a table's index."""
        if not 0 <= table < len(self.specs):
            raise IndexError(f"table {table} is outside [0, {len(self.specs)})")

    @contextlib.contextmanager
    def naming(self, t: int) -> Iterator[None]:
        """Re-raises a store's OSError (a full disk, a failed or corrupt read; its message
        names the file) with the table and tier in front, keeping its type and errno."""
        try:
            yield
        except OSError as e:
            raise type(e)(e.errno, f"table {self.names[t]} on {self.tiers[t].name}: {e.strerror or e}") from e

    def cached(self, t: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(row ids, slots) of table t's rows the cache holds in the TBE's slots."""
        rows, slots = self.index.occupied(t)
        keep = self.slots.in_tbe(t, slots)
        return rows[keep], slots[keep]

    def stats(self) -> Dict[str, Dict[str, float]]:
        """``TieredEmbeddingBags.cache_stats()``."""
        out: Dict[str, Dict[str, float]] = {}
        capacities = self.index.capacities()
        run = dict(self.engine.counters())
        engine = [dict(self.engine.table_counters(t)) for t in range(len(self.names))]
        moved = [dict(self.mover.counters(t)) for t in range(len(self.names))]
        # The plan covers every table at once: its CPU per row loaded by any of them.
        plan_ns_per_row = run["plan_cpu_ns"] / max(1, sum(m["rows_loaded"] for m in moved))
        for t, name in enumerate(self.names):
            e = engine[t]
            self.count_moved(t, e)  # the stores' stats() count the engine's moves too
            c = dict(self.index.counters(t))
            m = moved[t]
            loads, write_backs = max(1, m["rows_loaded"]), max(1, m["rows_written_back"])
            unique = max(1, c["unique_rows"])
            row_bytes = self.codecs[t].layout.row_bytes
            rows_loaded = e["rows_loaded"]
            rows_written_back = e["rows_written_back"] + self.counters[t].rows_written_back
            out[name] = {
                **{key: float(v) for key, v in c.items()},
                "hit_rate": c["hits"] / unique,
                "rows_loaded": float(rows_loaded),
                "rows_written_back": float(rows_written_back),
                "bytes_read_from_tier": float(rows_loaded * row_bytes),
                "bytes_written_to_tier": float(rows_written_back * row_bytes),
                "plan_seconds": run["plan_seconds"],
                "tier_seconds": e["move_seconds"],
                "cache_capacity_rows": float(capacities[t]),
                "prefetch_wait_seconds": run["wait_seconds"],
                "steps_prefetched": run["steps_prefetched"],
                "lookahead": float(self.engine.lookahead()),
                # The Adam family's update in the backward (adam_family.py), every table at
                # once; 0 where FBGEMM's fused optimizer updates inside its own backward.
                "update_seconds": self.slots.adam.seconds if self.slots.adam is not None else 0.0,
                # CPU ns per moved row of each stage of the step's row path (thread CPU time
                # of the thread that ran it; loads and write-backs counted apart).
                "plan_cpu_ns_per_row": plan_ns_per_row,
                "write_back_cpu_ns_per_row": m["write_back_ns"] / write_backs,
                "read_cpu_ns_per_row": m["read_ns"] / loads,
                "verify_cpu_ns_per_row": m["verify_ns"] / loads,
                "copy_cpu_ns_per_row": m["copy_ns"] / loads,
                # All of it per row loaded (a miss: planned, its eviction written back, read,
                # verified, copied into its slot).
                "cpu_ns_per_miss": plan_ns_per_row + (m["write_back_ns"] + m["read_ns"] + m["verify_ns"]
                                                      + m["copy_ns"]) / loads,
            }
            if t in self.virtual.tables:
                out[name].update(self.virtual.stats(t, row_bytes))
        return out
