"""StepPath: a batch's rows into the cache slots before its step computes.

The steps run in the kernel's C++ step engine (csrc/kernel/step_engine.h): ``prefetch``
submits a batch, which the engine checks and splits by table at once, then plans (the cache
index remaps its ids to slots) and moves (evicted dirty rows back to the tier, missing rows
from the tier into their slots) on its own threads, in step order; ``take`` waits for the
step ``forward`` computes and gets its slots. Slots in use by a live step (the one still in
its backward, and every step planned after it) are locked and never displaced, so a move only
touches slots no live step uses. Rows for overflow slots past the TBE wait in
``CacheSlots.deferred`` until it grows. A virtual table's misses go to its id index in C++
(``virtual_rows.py``). Python runs on the engine's threads only through the hooks
(``hooks.py``): a checkpoint's copy-on-write, fault points, the L2-norm eviction pass.
"""

from __future__ import annotations

import errno
from typing import List, Optional, Tuple

import torch

from torchrec_mtrains.kernels.batch import BatchSizes, check_index_tensor, feature_batch_of, raise_batch_problem
from torchrec_mtrains.kernels.hooks import EngineHooks, PrefetchCancelled
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.kernels.virtual_rows import VirtualTableFull
from torchrec_mtrains.storage.status import raise_for_status

__all__ = ["PrefetchCancelled", "StepPath"]

# StepFailure of csrc/kernel/step_engine.h.
_NONE, _MOVE, _PLAN, _HOOK, _EARLIER, _CANCELLED = range(6)

Outcome = Tuple[int, Tuple[int, int, str], int, int, List[int], List[torch.Tensor], List[torch.Tensor],
                List[torch.Tensor]]


class StepPath:
    """The steps of one kernel, from ``prefetch`` (or ``forward``) to rows in their slots.

    Holds no reference to the kernel: the kernel's exit hook (``lifetime.py``) must let the
    kernel be collected.

    Args:
        cache: the kernel's tables and cache.
        engine: its ``torch.classes.mtrains.StepEngine``.
        hooks: the engine's Python hooks (they keep the errors of failed steps).
        feature_table_map: FBGEMM's, checked (None: one feature per table).
    """

    def __init__(self, cache: RowCache, engine: torch.ScriptObject, hooks: EngineHooks,
                 feature_table_map: Optional[List[int]]) -> None:
        self.cache, self.engine, self.hooks = cache, engine, hooks
        self._by_table = feature_table_map is None
        self._num_features = len(cache.specs) if feature_table_map is None else len(feature_table_map)
        self._first_error: Optional[BaseException] = None
        self._written_back_seen = 0.0

    @property
    def pending(self) -> int:
        """Batches prefetched and not yet computed."""
        return self.engine.pending()

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool,
                 batch_sizes: Optional[BatchSizes] = None) -> None:
        """Queues the plan and moves of the batch after those pending.

        Raises:
            ValueError, IndexError: a bad batch (nothing is queued).
        """
        indices, offsets, feature_batch = self._checked(indices, offsets, batch_sizes)
        self.cache.virtual.read_clocks()
        raise_batch_problem(self.engine.submit(indices, offsets, feature_batch, train), indices, self.cache)

    def take(self, indices: torch.Tensor, offsets: torch.Tensor, train: bool,
             batch_sizes: Optional[BatchSizes] = None) -> torch.Tensor:
        """The slots of a batch about to compute: the step prefetched for it, else planned and
        moved now. Its rows are marked trained when ``train``; grows the TBE (between steps)
        if the cache overflowed.

        Raises:
            ValueError: a batch was prefetched and this is another one; or a bad batch.
            IndexError: an id outside its table.
        """
        indices, offsets, feature_batch = self._checked(indices, offsets, batch_sizes)
        cache = self.cache
        cache.virtual.read_clocks()
        slots, _, mismatch, problem, outcome = self.engine.take(indices, offsets, feature_batch, train)
        if mismatch:
            raise ValueError(
                f"forward() got a batch different from the one prefetch() was given for it "
                f"({self.engine.pending()} prefetched batch(es) pending): prefetch(b) loads the rows "
                "of the batch the next forward() computes, so call forward(b) first, then "
                "prefetch the batch after it; or cancel_prefetch() to drop pending prefetches")
        raise_batch_problem(problem, indices, cache)
        self._settle(outcome)
        if train:  # the rows this step trains may change: the next delta saves them
            cache.run.unflushed = True
        cache.run.last_forward_step = outcome[3]
        if cache.slots.deferred:  # a load went to an overflow slot past the TBE
            self.drain()
            self.grow()
        return slots

    def grow(self) -> None:
        """Rebuilds the TBE larger if a table's cache outgrew it (nothing in flight)."""
        cache = self.cache
        if cache.slots.grow(cache.index.capacities()):
            self.engine.set_slots(cache.slots.weights, cache.slots.move_states)

    def cancel(self) -> int:
        """Drops every pending step once its rows are in place (loads past the TBE too: it
        grows, as the slots the dropped steps held are free for the next plan); returns how
        many."""
        self.drain()
        dropped = self.engine.drop_pending()
        if self.cache.slots.deferred:
            self.grow()
        return dropped

    def mark_pending_created(self) -> None:
        """Marks the rows the pending steps gave to new ids as changed (a checkpoint taken
        now lists those ids as live: it saves their rows, their initial values)."""
        self.engine.mark_pending_created()

    def drain(self) -> None:
        """Waits for every queued step and puts its rows in their slots."""
        self._settle(self.engine.drain())
        written_back = self.engine.counters()["rows_written_back"]
        if written_back != self._written_back_seen:  # a write-back changed a tier
            self._written_back_seen = written_back
            self.cache.run.unflushed = True

    def _checked(self, indices: torch.Tensor, offsets: torch.Tensor, batch_sizes: Optional[BatchSizes]
                 ) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
        indices = check_index_tensor("indices", indices)
        offsets = check_index_tensor("offsets", offsets)
        return indices, offsets, feature_batch_of(offsets, batch_sizes, self._num_features, self._by_table)

    def _settle(self, outcome: Outcome) -> None:
        """Raises a failed step's error (the cache is broken from then on); keeps the rows of
        loads past the TBE until it grows."""
        failure, status, table, step, tables, slots, ids, rows = outcome
        cache = self.cache
        if failure != _NONE:
            try:
                self._raise(failure, status, table, step)
            except BaseException as e:
                if self._first_error is None and failure not in (_EARLIER, _CANCELLED):
                    self._first_error = e
                cache.broken = f"a prefetch failed ({type(e).__name__}: {e})"
                raise
        for t, s, i, r in zip(tables, slots, ids, rows):
            codec = cache.codecs[t]
            cache.slots.defer(t, s, i, r.view(codec.dtype).view(i.numel(), -1))

    def _raise(self, failure: int, status: Tuple[int, int, str], table: int, step: int) -> None:
        cache = self.cache
        if failure == _HOOK:
            error = self.hooks.take_error(step)
            if error is not None:
                raise error
            raise RuntimeError(status[2])
        if failure == _PLAN:
            error = cache.virtual.take_error(step)  # the L2-norm pass's
            if error is not None:
                raise error
            if status[1] == errno.ENOSPC:
                raise VirtualTableFull(status[2])
        if failure == _MOVE and table >= 0:
            with cache.naming(table):
                raise_for_status(status)
        if failure == _CANCELLED:
            raise PrefetchCancelled(status[2])
        if failure == _EARLIER:
            first = self._first_error
            what = f"{type(first).__name__}: {first}" if first is not None else status[2]
            raise RuntimeError(f"an earlier prefetch failed ({what})")
        raise_for_status(status)
        raise RuntimeError(status[2])

