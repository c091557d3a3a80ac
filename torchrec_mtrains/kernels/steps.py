"""StepPath: a batch's rows into the cache slots before its step computes.

A step is planned (the cache index remaps its ids to slots and packs the rows it evicts),
its rows are moved (evictions written back to the tier, misses read from it), and the rows
read are put in their slots by the thread that computes the step, just before it does.
Plans and moves run on the ``PrefetchPipeline``, so with ``prefetch()`` they overlap the
step before; slots in use by a live step (the one still in its backward, and every step
planned after it) are locked and never displaced.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Deque, List, Optional

import torch

from torchrec_mtrains.kernels.batch import Batch, split_batch
from torchrec_mtrains.kernels.prefetch import PrefetchPipeline, Ticket
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["Move", "Step", "StepPath"]


@dataclasses.dataclass
class Step:
    """One planned step: its batch, its remapped indices once planned."""

    step: int
    batch: Batch
    train: bool = True
    ticket: Optional[Ticket] = None
    remapped: Optional[torch.Tensor] = None
    moves: List["Move"] = dataclasses.field(default_factory=list)  # tables with rows to move


@dataclasses.dataclass
class Move:
    """Rows one table's plan moves: loads into slots, evictions packed out of them."""

    table: int
    load_rows: torch.Tensor
    load_slots: torch.Tensor
    evict_rows: torch.Tensor
    evicted: Optional[torch.Tensor]  # packed rows of evict_rows, [n, row_width]
    pack_seconds: float
    buffer: Optional[torch.Tensor] = None  # the read buffer taken for this move
    rows: Optional[torch.Tensor] = None  # rows read for load_rows (the buffer's first rows)
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
        self._free_bufs: List[List[torch.Tensor]] = [[] for _ in cache.specs]  # read buffers

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool) -> None:
        """Queues the plan and moves of the batch after those pending."""
        self.pending.append(self.submit(indices, offsets, train))

    def cancel(self) -> int:
        """Drops every pending step once its rows are in place; returns how many."""
        dropped = len(self.pending)
        self.drain()
        self.pending.clear()
        return dropped

    def take(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool) -> Step:
        """The step of a checked batch: the one prefetched for it, else planned now.

        Raises:
            ValueError: a batch was prefetched and this is another one.
        """
        if not self.pending:
            return self.submit(indices, offsets, train)
        job = self.pending[0]
        if not _same(job.batch.indices, indices) or not _same(job.batch.offsets, offsets):
            raise ValueError(
                f"forward() got a batch different from the one prefetch() was given for it "
                f"({len(self.pending)} prefetched batch(es) pending): prefetch(b) loads the rows "
                "of the batch the next forward() computes, so call forward(b) first, then "
                "prefetch the batch after it; or cancel_prefetch() to drop pending prefetches")
        self.pending.popleft()
        self.cache.run.steps_prefetched += 1
        return job

    def submit(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool) -> Step:
        cache = self.cache
        batch = split_batch(indices, offsets, cache.specs, cache.names, self._feature_table_map)
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
            torch.ops.mtrains.mark_row_bits(cache.dirty_bits, job.batch.indices, bounds)
        cache.run.last_forward_step = job.step

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
        """Stage 1 (plan worker): remaps the batch to slots and packs the evicted rows.

        Runs while the row moves of earlier steps are still in flight: the slots it
        displaces are not locked by any live step, so none of them is being filled or
        computed on, and their rows are copied out here, before any later load reuses them.
        One C++ call plans every table; only tables with rows to move get a ``Move``.
        Returns whether any has (else the move stage has nothing to do).
        """
        fault_point("prefetch.before")
        cache, batch = self.cache, job.batch
        remapped, tables, load_rows, load_slots, evict_rows, evicted, plan_s, pack_s = cache.index.plan_step(
            batch.indices, batch.bounds, job.step, oldest_live, train, cache.slots.weights, cache.slots.plan_states,
            cache.codecs[0].dtype)
        cache.run.plan_seconds += plan_s
        job.moves = [Move(*move) for move in zip(tables, load_rows, load_slots, evict_rows, evicted, pack_s)]
        job.remapped = remapped
        fault_point("prefetch.after")
        return bool(job.moves)

    def _move(self, job: Step) -> None:
        """Stage 2 (I/O worker, in step order): writes the evicted rows back and reads the
        missing ones, in one store call per table whose device writes overlap its reads.
        Steps move in order, so a row evicted by one step and loaded again by a later one
        is read after its write-back was accepted. The rows read wait in ``job.moves``
        for ``_unpack`` (by the consumer), so the worker goes on to the next step's I/O."""
        cache = self.cache
        for m in job.moves:
            t = m.table
            t0 = time.perf_counter()
            n_load = m.load_rows.numel()
            if n_load or m.evict_rows.numel():
                m.buffer = self._take_buffer(t, n_load)
                with cache.naming(t):
                    if m.evict_rows.numel():
                        cache.run.unflushed = True
                    m.rows = cache.stores[t].exchange(m.evict_rows, m.evicted, m.load_rows, m.buffer[:n_load])
                m.evicted = None
            m.move_seconds = time.perf_counter() - t0

    def _unpack(self, job: Step) -> None:
        """Copies a moved step's rows into their slots (the consumer thread, before the
        step computes or anything reads the slots). Idempotent."""
        cache = self.cache
        for m in job.moves:
            t = m.table
            counters = cache.counters[t]
            t0 = time.perf_counter()
            n_load = m.load_rows.numel()
            counters.rows_written_back += m.evict_rows.numel()
            counters.rows_loaded += n_load
            if n_load:  # overflow slots past the TBE are filled once it grows, between steps
                cache.slots.load(t, m.load_slots, m.load_rows, m.rows)
            if m.buffer is not None:
                self._free_bufs[t].append(m.buffer)
            counters.tier_seconds += m.pack_seconds + m.move_seconds + time.perf_counter() - t0
        job.moves = []

    def _take_buffer(self, t: int, n: int) -> torch.Tensor:
        """A read buffer of table t with room for ``n`` rows: a free one (returned by
        ``_unpack``) if large enough, else a new one with half again as many rows."""
        free = self._free_bufs[t]
        buf = free.pop() if free else None  # list.pop is atomic: the consumer appends
        if buf is None or buf.shape[0] < n:
            codec = self.cache.codecs[t]
            buf = torch.empty((n + n // 2, codec.layout.row_width), dtype=codec.dtype)
        return buf


def _same(a: torch.Tensor, b: object) -> bool:
    return a is b or (isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b.to(torch.int64)))
