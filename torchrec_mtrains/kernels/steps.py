"""StepPath: a batch's rows into the cache slots before its step computes.

A step is planned (the cache index remaps its ids to slots), then its rows are moved by
the kernel's C++ step mover in one call for every table (kernel/step_mover.h): evicted dirty
rows from their slots back to the tier, missing rows from the tier into their slots. Plans
and moves run on the ``PrefetchPipeline``, so with ``prefetch()`` they overlap the step
before; slots in use by a live step (the one still in its backward, and every step planned
after it) are locked and never displaced, so a move only touches slots no live step uses.
Rows for overflow slots past the TBE wait in ``CacheSlots.deferred`` until it grows.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Deque, Dict, List, Optional

import torch

from torchrec_mtrains.kernels.batch import Batch, BatchSizes, split_batch
from torchrec_mtrains.kernels.prefetch import PrefetchPipeline, Ticket
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.storage.status import raise_for_status
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["Move", "Step", "StepPath"]


@dataclasses.dataclass
class Step:
    """One planned step: its batch, its remapped indices once planned."""

    step: int
    batch: Batch
    train: bool = True
    ticket: Optional[Ticket] = None
    rows: Optional[torch.Tensor] = None  # the tables' rows of the indices, once planned
    remapped: Optional[torch.Tensor] = None
    # Per virtual table, the rows its plan gave to new ids: they change (made) whether the
    # step trains or not, so a checkpoint saves them.
    created_rows: Dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    moves: List["Move"] = dataclasses.field(default_factory=list)  # tables with rows to move


@dataclasses.dataclass
class Move:
    """Rows one table's plan moves: loads into slots, evictions out of them."""

    table: int
    load_rows: torch.Tensor
    load_slots: torch.Tensor
    evict_rows: torch.Tensor
    evict_slots: torch.Tensor
    overflow_at: Optional[torch.Tensor] = None  # positions in load_rows of loads past the TBE
    overflow_rows: Optional[torch.Tensor] = None  # their rows, until the TBE grows
    lazy_rows: int = 0  # rows loaded that were never written (their initial value made)
    move_seconds: float = 0.0


class StepPath:
    """The steps of one kernel, from ``prefetch`` (or ``forward``) to rows in their slots.

    Holds no reference to the kernel: the pipeline's queued jobs refer to this object, and
    the kernel's exit hook (``lifetime.py``) must let the kernel be collected.

    Args:
        cache: the kernel's tables and cache.
        pipeline: runs the plans and the moves.
        feature_table_map: FBGEMM's, checked (None: one feature per table).
    """

    def __init__(self, cache: RowCache, pipeline: PrefetchPipeline, feature_table_map: Optional[List[int]]) -> None:
        self.cache, self.pipeline = cache, pipeline
        self._feature_table_map = feature_table_map
        self.pending: Deque[Step] = collections.deque()  # prefetched, not yet computed

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool,
                 batch_sizes: Optional[BatchSizes] = None) -> None:
        """Queues the plan and moves of the batch after those pending."""
        self.pending.append(self.submit(indices, offsets, train, batch_sizes))

    def cancel(self) -> int:
        """Drops every pending step once its rows are in place; returns how many."""
        dropped = len(self.pending)
        self.drain()
        self.pending.clear()
        return dropped

    def take(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool,
             batch_sizes: Optional[BatchSizes] = None) -> Step:
        """The step of a checked batch: the one prefetched for it, else planned now.

        Raises:
            ValueError: a batch was prefetched and this is another one.
        """
        if not self.pending:
            return self.submit(indices, offsets, train, batch_sizes)
        job = self.pending[0]
        if (not _same(job.batch.indices, indices) or not _same(job.batch.offsets, offsets)
                or _as_lists(job.batch.batch_sizes) != _as_lists(batch_sizes)):
            raise ValueError(
                f"forward() got a batch different from the one prefetch() was given for it "
                f"({len(self.pending)} prefetched batch(es) pending): prefetch(b) loads the rows "
                "of the batch the next forward() computes, so call forward(b) first, then "
                "prefetch the batch after it; or cancel_prefetch() to drop pending prefetches")
        self.pending.popleft()
        self.cache.run.steps_prefetched += 1
        return job

    def submit(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool,
               batch_sizes: Optional[BatchSizes] = None) -> Step:
        cache = self.cache
        batch = split_batch(indices, offsets, cache.id_specs, cache.names, self._feature_table_map, batch_sizes)
        job = Step(cache.run.next_step, batch)
        cache.run.next_step += 1
        # Rows of the step that may still be running (its backward) and of every step
        # planned after it stay locked.
        oldest_live = max(0, cache.run.last_forward_step)
        job.train = train
        job.ticket = self.pipeline.submit(lambda: self._plan(job, oldest_live, train), lambda: self._move(job))
        return job

    def finish(self, job: Step) -> None:
        """Waits for the job's row moves and copies its rows into their slots; grows the
        TBE (between steps) if the cache overflowed."""
        cache = self.cache
        t0 = time.perf_counter()
        try:
            self.pipeline.wait(job.ticket)
            cache.run.wait_seconds += time.perf_counter() - t0
            self._unpack(job)
        except BaseException as e:
            cache.broken = f"a prefetch failed ({type(e).__name__}: {e})"
            raise
        if cache.slots.deferred:  # a load went to an overflow slot past the TBE
            self.drain()
            cache.slots.grow(cache.index.capacities())

    def computed(self, job: Step, train: bool) -> None:
        """Records that ``job`` computes now (``train``: in training mode)."""
        cache, bounds = self.cache, job.batch.bounds
        if train and not job.train:
            # Planned in eval mode, computed in train mode: its rows are about to change.
            for t in range(len(cache.specs)):
                cache.index.mark_dirty(t, job.remapped[bounds[t] : bounds[t + 1]])
        if train:  # the rows this step trains may change: the next delta saves them
            cache.run.unflushed = True
            torch.ops.mtrains.mark_row_bits(cache.dirty_bits, job.rows, bounds)
        self._mark_created(job)
        cache.run.last_forward_step = job.step

    def mark_pending_created(self) -> None:
        """Marks the rows the pending steps gave to new ids as changed (a checkpoint taken
        now lists those ids as live: it saves their rows, their initial values)."""
        for job in self.pending:
            self._mark_created(job)

    def _mark_created(self, job: Step) -> None:
        for t, rows in job.created_rows.items():
            self.cache.dirty[t].mark(rows)

    def drain(self) -> None:
        """Waits for every queued job and puts its rows in their slots."""
        for job in list(self.pending):
            try:
                self.pipeline.wait(job.ticket)
                self._unpack(job)
            except BaseException as e:
                self.cache.broken = f"a prefetch failed ({type(e).__name__}: {e})"
                raise

    def _plan(self, job: Step, oldest_live: int, train: bool) -> bool:
        """Stage 1 (plan worker): remaps the batch to slots and picks the rows to move.

        Runs while the row moves of earlier steps are still in flight: the slots it
        displaces are locked by no live step, so nothing fills, computes on or displaces
        them again before this step's move writes their rows back. One C++ call plans every
        table; only tables with rows to move get a ``Move``. Returns whether any has (else
        the move stage has nothing to do).
        """
        fault_point("prefetch.before")
        cache, batch = self.cache, job.batch
        rows, created = batch.indices, {}
        if cache.virtual:  # virtual tables' ids -> their rows (new ids take fresh rows)
            rows, created = cache.virtual.map_step(batch.indices, batch.bounds, job.step, oldest_live)
            job.created_rows = {t: rows[batch.bounds[t] + at] for t, at in created.items()}
        job.rows = rows
        remapped, tables, load_rows, load_slots, evict_rows, evict_slots, plan_s, plan_cpu_ns = \
            cache.index.plan_step(rows, batch.bounds, job.step, oldest_live, train)
        if not train:  # a fresh row's slot must reach the tier, trained or not
            for t, at in created.items():
                cache.index.mark_dirty(t, remapped[batch.bounds[t] + at])
        cache.run.plan_seconds += plan_s
        cache.run.plan_cpu_ns += plan_cpu_ns
        job.moves = [Move(*move) for move in zip(tables, load_rows, load_slots, evict_rows, evict_slots)]
        job.remapped = remapped
        fault_point("prefetch.after")
        return bool(job.moves)

    def _move(self, job: Step) -> None:
        """Stage 2 (I/O worker, in step order): one C++ call writes every moved table's
        evicted rows back and reads its missing rows into their slots, without the GIL.
        Steps move in order, so a row evicted by one step and loaded again by a later one
        is read after its write-back was accepted."""
        cache, moves = self.cache, job.moves
        if not moves:
            return
        slots = cache.slots
        t0 = time.perf_counter()
        if any(m.evict_rows.numel() for m in moves):
            cache.run.unflushed = True
            for m in moves:  # a checkpoint saving in the background keeps the old rows first
                snapshot = cache.snapshots.get(m.table)
                if snapshot is not None:
                    snapshot.before_write(m.evict_rows)
        failed, status, overflow_at, overflow_rows, lazy = cache.mover.move(
            [m.table for m in moves], [slots.weights[m.table] for m in moves],
            [slots.move_states[m.table] for m in moves], [m.evict_rows for m in moves],
            [m.evict_slots for m in moves], [m.load_rows for m in moves], [m.load_slots for m in moves])
        seconds = (time.perf_counter() - t0) / len(moves)
        for m, at, rows, n_lazy in zip(moves, overflow_at, overflow_rows, lazy):
            m.overflow_at, m.overflow_rows, m.lazy_rows, m.move_seconds = at, rows, n_lazy, seconds
        if failed >= 0:
            with cache.naming(moves[failed].table):
                raise_for_status(status)

    def _unpack(self, job: Step) -> None:
        """Counts a moved step's rows and leaves the rows of its loads past the TBE for it to
        take in once it grows (the consumer thread, before the step computes). Idempotent."""
        cache = self.cache
        for m in job.moves:
            t = m.table
            counters = cache.counters[t]
            n_load, n_evict = m.load_rows.numel(), m.evict_rows.numel()
            counters.rows_written_back += n_evict
            counters.rows_loaded += n_load
            counters.tier_seconds += m.move_seconds
            cache.stores[t].count_moved(n_load, n_evict, m.lazy_rows)
            if m.overflow_at is not None and m.overflow_at.numel():
                cache.slots.defer(t, m.load_slots[m.overflow_at], m.load_rows[m.overflow_at], m.overflow_rows)
        job.moves = []


def _as_lists(batch_sizes: Optional[BatchSizes]) -> Optional[List[List[int]]]:
    return None if batch_sizes is None else [list(per_rank) for per_rank in batch_sizes]


def _same(a: torch.Tensor, b: object) -> bool:
    return a is b or (isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b.to(torch.int64)))
