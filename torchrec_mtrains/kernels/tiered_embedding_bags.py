"""TieredEmbeddingBags: FBGEMM's TBE computing on a row cache over DRAM, SCM or SSD tiers.

Each table's rows live in a backing store on its tier (one tier per table: a rank's tables
of several tiers share one kernel, so one TBE); a set-associative row cache
(csrc/cache) keeps the rows in use in the weights of one FBGEMM
``SplitTableBatchedEmbeddingBagsCodegen`` (HOST/CPU), whose table t has one row per cache
slot. A step's indices are remapped to slots, so forward, backward and the fused optimizer
are FBGEMM's own code. Before a step, its missing rows are read from the tier into their
slots and the dirty rows they displace (weights + optimizer state) are written back; slots
in use by a step still running are locked and never displaced. ``prefetch()`` does this for
the next batch on a background thread while the current one computes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Deque, Dict, List, Optional, Sequence, Tuple, Union

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.kernels.batch import (
    Batch,
    check_embedding_specs,
    check_feature_table_map,
    check_index_tensor,
    split_batch,
)
from torchrec_mtrains.kernels.checkpoint_rows import CheckpointRows
from torchrec_mtrains.kernels.config import DEFAULTS, TieredConfig, resolve_config
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.lifetime import KernelResources
from torchrec_mtrains.kernels.prefetch import PrefetchPipeline, Ticket
from torchrec_mtrains.kernels.row_codec import RowCodec
from torchrec_mtrains.kernels.tier_stores import StoreSpec, create_store
from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.storage import RowStore
from torchrec_mtrains.testing.faults import fault_point
from torchrec_mtrains.types import Tier

__all__ = ["TieredEmbeddingBags"]

_SETTINGS = frozenset(f.name for f in dataclasses.fields(TieredConfig))
_READ_CHUNK_ROWS = 1 << 16  # rows per store read when materialising a whole table
_FLUSH_CHUNK_ROWS = 1 << 16  # dirty rows per store write when flushing the cache


def _setting(name: str) -> property:
    """A read-only attribute that is the kernel config's ``name``: one home for each setting."""
    return property(lambda self: getattr(self.config, name), doc=f"``config.{name}``.")


@dataclasses.dataclass
class _Step:
    """One planned step: its batch, its remapped indices once planned."""

    step: int
    batch: Batch
    train: bool = True
    ticket: Optional[Ticket] = None
    remapped: Optional[torch.Tensor] = None
    moves: List["_Move"] = dataclasses.field(default_factory=list)  # tables with rows to move


@dataclasses.dataclass
class _Move:
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


@dataclasses.dataclass
class _Deferred:
    """Rows loaded for overflow slots past the TBE's current size, copied in once it grows."""

    table: int
    slots: torch.Tensor
    ids: torch.Tensor
    rows: torch.Tensor


class _RunState:
    """The scalars every step updates, in a plain object: an ``nn.Module`` attribute
    assignment costs microseconds (``Module.__setattr__``), which each step would pay for
    each of these."""

    __slots__ = ("next_step", "last_forward_step", "unflushed", "wait_seconds", "plan_seconds",
                 "steps_prefetched")

    def __init__(self) -> None:
        self.next_step = 0
        self.last_forward_step = -1
        # False once a flush left the tiers holding every row as the cache has it; any
        # training step, write-back or set_rows makes it True again.
        self.unflushed = True
        self.wait_seconds = 0.0  # forward's wait for prefetches
        self.plan_seconds = 0.0  # the cache index's work, every table at once
        self.steps_prefetched = 0  # forwards whose rows a prefetch() loaded


@dataclasses.dataclass
class _TableCounters:
    rows_loaded: int = 0
    rows_written_back: int = 0
    tier_seconds: float = 0.0  # moving rows to and from the tier


class TieredEmbeddingBags(CheckpointRows, torch.nn.Module):
    """Pooled embedding bags over tables stored on a tier behind a row cache.

    A drop-in for FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` forward: indices are
    laid out table-major, ``offsets`` has ``T * B + 1`` entries.

    The settings come either as the arguments below or all at once as ``config`` (a
    ``TieredConfig``, whose fields are these arguments and whose defaults are theirs).

    Args:
        embedding_specs: ``(num_rows, dim)`` per table; dims must be multiples of 4.
        tier: where the tables live (Tier.DRAM, Tier.SCM or Tier.SSD): one for every table,
            or one per table.
        cache_rows: cache slots per table (an int for all tables, or one per table);
            may exceed the table. Default: ``cache_load_factor`` of each table's rows.
        cache_load_factor: cache size as a fraction of each table's rows (default
            ``DEFAULT_CACHE_LOAD_FACTOR``).
        storage_dir: directory for the SCM/SSD table files (created if missing; files of
            the same table names there are replaced: this is working storage).
        optimizer: EXACT_ROWWISE_ADAGRAD, EXACT_ADAGRAD or EXACT_SGD (fused, FBGEMM's).
        learning_rate, eps: optimizer hyper-parameters.
        pooling_mode: PoolingMode.SUM or PoolingMode.MEAN.
        cache_algorithm: "lru", "lfu" or "tinylfu" (LFU behind a TinyLFU admission filter).
        prefetch_pipeline: run ``prefetch()`` on a background thread (False: inline).
        weights_precision: SparseType.FP32 or SparseType.FP16.
        cache_ways: ways per cache set (default 32, at most 1024).
        init_range: initial weights are uniform(lo, hi), one pair for all tables or one
            per table; default ``(-1/sqrt(rows), 1/sqrt(rows))`` per table as in TorchRec.
        seed: seeds the initial weights (a pure function of seed, table and row).
        table_names: names used in file names, errors and stats (default "table_<t>").
        ssd_dram_cache_mb: DRAM cache of each SSD block store, under the row cache, in MiB.
        feature_table_map: FBGEMM's: the table of each feature (non-decreasing), when
            tables have several features; offsets then have ``F * B + 1`` entries.
        config: every setting above at once; the arguments for them must then keep their
            defaults.

    Raises:
        ValueError: a bad setting (naming it), or ``config`` with a setting changed.
    """

    tier = _setting("tier")
    optimizer = _setting("optimizer")
    pooling_mode = _setting("pooling_mode")
    weights_precision = _setting("weights_precision")
    learning_rate = _setting("learning_rate")
    eps = _setting("eps")
    cache_algorithm = _setting("cache_algorithm")
    cache_ways = _setting("cache_ways")

    def __init__(
        self,
        embedding_specs: Sequence[Tuple[int, int]],
        tier: Tier = DEFAULTS.tier,
        cache_rows: Optional[Union[int, Sequence[int]]] = DEFAULTS.cache_rows,
        cache_load_factor: Optional[float] = DEFAULTS.cache_load_factor,
        storage_dir: Optional[str] = DEFAULTS.storage_dir,
        optimizer: EmbOptimType = DEFAULTS.optimizer,
        learning_rate: float = DEFAULTS.learning_rate,
        eps: float = DEFAULTS.eps,
        pooling_mode: PoolingMode = DEFAULTS.pooling_mode,
        cache_algorithm: str = DEFAULTS.cache_algorithm,
        prefetch_pipeline: bool = DEFAULTS.prefetch_pipeline,
        *,
        weights_precision: SparseType = DEFAULTS.weights_precision,
        cache_ways: int = DEFAULTS.cache_ways,
        init_range: Optional[Union[Tuple[float, float], Sequence[Tuple[float, float]]]] = DEFAULTS.init_range,
        seed: int = DEFAULTS.seed,
        table_names: Optional[Sequence[str]] = DEFAULTS.table_names,
        ssd_dram_cache_mb: float = DEFAULTS.ssd_dram_cache_mb,
        feature_table_map: Optional[Sequence[int]] = DEFAULTS.feature_table_map,
        config: Optional[TieredConfig] = None,
    ) -> None:
        # The settings' arguments by name, taken before any other local exists.
        settings = {name: value for name, value in locals().items() if name in _SETTINGS}
        super().__init__()
        load_extension()
        specs = check_embedding_specs(embedding_specs)
        config = resolve_config(config, settings)
        num_rows = [rows for rows, _ in specs]
        self.config = config
        self.embedding_specs = specs
        self.table_names = config.names(len(specs))
        self.tiers = config.tiers(len(specs))  # each table's
        self.feature_table_map = check_feature_table_map(config.feature_table_map, len(specs))
        self.cache_rows = config.cache_sizes(num_rows)
        self._codecs = [RowCodec(config.layout(dim)) for _, dim in specs]
        self._init_ranges = config.init_ranges(num_rows)
        self._stores = self._create_stores(self._init_ranges)
        # Every table's cache index, planned in one C++ call per step.
        self._index = torch.classes.mtrains.KernelCacheIndex(
            list(self.cache_rows), config.cache_ways, config.cache_algorithm)
        self._tbe_rows = [n + max(config.cache_ways, n // 8) for n in self.cache_rows]
        self._tbe = self._make_tbe(self._tbe_rows)
        self._pipeline = PrefetchPipeline(background=config.prefetch_pipeline)
        # Stops the prefetch threads and closes the stores at close(), collection or exit.
        self._resources = KernelResources(self, self._pipeline, self._stores, self.table_names)
        self._pending: Deque[_Step] = collections.deque()
        self._deferred: List[_Deferred] = []
        self._run = _RunState()
        self._broken: Optional[str] = None
        self._closed = False
        self._counters = [_TableCounters() for _ in specs]
        # Rows trained (or set) since the last clear_dirty(): what a differential checkpoint
        # saves. Marked as a training forward looks them up, so rows a prefetch loaded for
        # a step not yet computed are not among them.
        self._dirty = [DirtyRows(rows) for rows in num_rows]
        self._dirty_bits = [d.bits for d in self._dirty]
        self._free_bufs: List[List[torch.Tensor]] = [[] for _ in specs]  # read buffers

    def _create_stores(self, ranges: List[Tuple[float, float]]) -> List[RowStore]:
        """Each table's backing store on the tier, its rows initialised from ``ranges``."""
        config = self.config
        return [
            create_store(
                self.tiers[t],
                StoreSpec(
                    name=self.table_names[t], num_rows=rows, row_width_dim=dim,
                    state_slots=self._codecs[t].layout.state_slots, dtype=self._codecs[t].dtype,
                    init_range=ranges[t], seed=self.store_seed(t), storage_dir=config.storage_dir,
                    ssd_dram_cache_mb=config.ssd_dram_cache_mb,
                ),
            )
            for t, (rows, dim) in enumerate(self.embedding_specs)
        ]

    def store_seed(self, table: int) -> int:
        """The seed of table ``table``'s initial rows on its tier (``lazy_init_rows``)."""
        return self.config.seed * 1_000_003 + table

    def init_range(self, table: int) -> Tuple[float, float]:
        """The range of table ``table``'s initial weights."""
        return tuple(self._init_ranges[table])  # type: ignore[return-value]

    # ------------------------------------------------------------ table layout ----
    @property
    def layouts(self) -> List[TableLayout]:
        """Each table's row layout: its weights, then its optimizer state."""
        return [codec.layout for codec in self._codecs]

    @property
    def weights_dtype(self) -> torch.dtype:
        """The torch dtype of every table's weights (float32 or float16)."""
        return self._codecs[0].dtype

    def set_learning_rate(self, learning_rate: float) -> None:
        """Sets the fused optimizer's learning rate for the next steps (kept if the TBE
        is rebuilt to grow its cache).

        Raises:
            ValueError: ``learning_rate`` is not a finite number >= 0.
        """
        self.config = dataclasses.replace(self.config, learning_rate=learning_rate)
        self._tbe.set_learning_rate(self.learning_rate)

    # ---------------------------------------------------------------- FBGEMM TBE ----
    def _make_tbe(self, rows: List[int]) -> SplitTableBatchedEmbeddingBagsCodegen:
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(r, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, (_, dim) in zip(rows, self.embedding_specs)],
            optimizer=self.optimizer,
            learning_rate=self.learning_rate,
            eps=self.eps,
            pooling_mode=self.pooling_mode,
            weights_precision=self.weights_precision,
            output_dtype=SparseType.FP32,
            feature_table_map=self.feature_table_map,
        )
        # Aliases with their own autograd version counters: the prefetch thread fills slots
        # of the next step while autograd holds the weights of the current one, and those
        # writes (to other rows) must not invalidate its saved tensors.
        self._weights = [_alias(w) for w in tbe.split_embedding_weights()]
        states = tbe.split_optimizer_states() if self._codecs[0].layout.state_values else []
        self._states = [_alias(s[0]) for s in states] if states else [None] * len(rows)
        # The plan call's view of the same tensors: an empty tensor where there is no state.
        self._plan_states = [_NO_STATE if s is None else s for s in self._states]
        return tbe

    def _grow_tbe(self) -> None:
        """Resizes the TBE when an overflow pool grew past it. Call only between steps."""
        need = self._index.capacities()
        if all(n <= r for n, r in zip(need, self._tbe_rows)):
            return
        old_w, old_s, old_rows = self._weights, self._states, self._tbe_rows
        new_rows = [max(r, n + max(self.cache_ways, n // 4)) if n > r else r for n, r in zip(need, old_rows)]
        self._tbe = self._make_tbe(new_rows)
        self._tbe_rows = new_rows
        with torch.no_grad():
            for t in range(len(new_rows)):
                self._weights[t][: old_rows[t]].copy_(old_w[t])
                if old_s[t] is not None:
                    self._states[t][: old_rows[t]].copy_(old_s[t])
        deferred, self._deferred = self._deferred, []
        for d in deferred:
            self._codecs[d.table].scatter(self._weights[d.table], self._states[d.table], d.slots, d.rows)

    # ------------------------------------------------------------------- steps ----
    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Starts loading the rows of the batch that the next ``forward`` (after any already
        prefetched) will compute, so the tier I/O overlaps the current step.

        Each prefetched batch must be the next one given to ``forward``, in order: call
        ``prefetch(b0)`` once, then each step ``out = emb(b_i)``, ``prefetch(b_{i+1})``,
        ``backward``. A caller whose next batch changed drops its prefetches with
        ``cancel_prefetch()``."""
        self._check_usable()
        self._pending.append(self._submit(indices, offsets))

    @property
    def pending_prefetches(self) -> int:
        """Batches given to ``prefetch`` that no ``forward`` has computed yet."""
        return len(self._pending)

    def cancel_prefetch(self) -> int:
        """Drops every pending prefetch, so the next ``forward`` may take any batch.

        The rows already on their way are still put in the cache (a prefetch's row moves
        cannot be undone: its evicted rows are written back as usual), so nothing is lost and
        they serve later steps that look them up. Returns how many prefetches were dropped."""
        self._check_usable()
        dropped = len(self._pending)
        self._drain()
        self._pending.clear()
        return dropped

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Pooled embeddings ``[B, sum(dims)]`` of a batch (FBGEMM's layout)."""
        self._check_usable()
        # Everything about the input is checked before a queued plan is consumed or a new
        # one made, so a bad call changes nothing and can be retried.
        indices, offsets = check_index_tensor("indices", indices), check_index_tensor("offsets", offsets)
        n = indices.numel()
        if per_sample_weights is not None and (
            not isinstance(per_sample_weights, torch.Tensor)
            or not per_sample_weights.is_floating_point()
            or tuple(per_sample_weights.shape) != (n,)
        ):
            raise ValueError(f"per_sample_weights must be a float tensor of shape ({n},) like indices")
        if self._pending:
            job = self._pending[0]
            if not _same(job.batch.indices, indices) or not _same(job.batch.offsets, offsets):
                raise ValueError(
                    f"forward() got a batch different from the one prefetch() was given for it "
                    f"({len(self._pending)} prefetched batch(es) pending): prefetch(b) loads the rows "
                    "of the batch the next forward() computes, so call forward(b) first, then "
                    "prefetch the batch after it; or cancel_prefetch() to drop pending prefetches")
            self._pending.popleft()
            self._run.steps_prefetched += 1
        else:
            job = self._submit(indices, offsets)
        self._finish(job)
        bounds = job.batch.bounds
        if self.training and not job.train:
            # Planned in eval mode, computed in train mode: its rows are about to change.
            for t in range(len(self.embedding_specs)):
                self._index.mark_dirty(t, job.remapped[bounds[t] : bounds[t + 1]])
        if self.training:  # the rows this step trains may change: the next delta saves them
            self._run.unflushed = True
            torch.ops.mtrains.mark_row_bits(self._dirty_bits, job.batch.indices, bounds)
        self._run.last_forward_step = job.step
        fault_point("forward")
        return self._tbe(job.remapped, job.batch.offsets, per_sample_weights)

    def _submit(self, indices: torch.Tensor, offsets: torch.Tensor) -> _Step:
        batch = split_batch(indices, offsets, self.embedding_specs, self.table_names, self.feature_table_map)
        job = _Step(self._run.next_step, batch)
        self._run.next_step += 1
        # Rows of the step that may still be running (its backward) and of every step
        # planned after it stay locked.
        oldest_live = max(0, self._run.last_forward_step)
        job.train = train = self.training
        job.ticket = self._pipeline.submit(lambda: self._plan(job, oldest_live, train), lambda: self._move(job))
        return job

    def _plan(self, job: _Step, oldest_live: int, train: bool) -> bool:
        """Stage 1 (plan worker): remaps the batch to slots and packs the evicted rows.

        Runs while the row moves of earlier steps are still in flight: the slots it
        displaces are not locked by any live step, so none of them is being filled or
        computed on, and their rows are copied out here, before any later load reuses them.
        One C++ call plans every table; only tables with rows to move get a ``_Move``.
        Returns whether any has (else the move stage has nothing to do).
        """
        fault_point("prefetch.before")
        batch = job.batch
        remapped, tables, load_rows, load_slots, evict_rows, evicted, plan_s, pack_s = self._index.plan_step(
            batch.indices, batch.bounds, job.step, oldest_live, train, self._weights, self._plan_states,
            self.weights_dtype)
        self._run.plan_seconds += plan_s
        job.moves = [_Move(*move) for move in zip(tables, load_rows, load_slots, evict_rows, evicted, pack_s)]
        job.remapped = remapped
        fault_point("prefetch.after")
        return bool(job.moves)

    def _move(self, job: _Step) -> None:
        """Stage 2 (I/O worker, in step order): writes the evicted rows back and reads the
        missing ones, in one store call per table whose device writes overlap its reads.
        Steps move in order, so a row evicted by one step and loaded again by a later one
        is read after its write-back was accepted. The rows read wait in ``job.moves``
        for ``_unpack`` (by the consumer), so the worker goes on to the next step's I/O."""
        for m in job.moves:
            t = m.table
            t0 = time.perf_counter()
            n_load = m.load_rows.numel()
            if n_load or m.evict_rows.numel():
                m.buffer = self._take_buffer(t, n_load)
                with self._naming(t):
                    if m.evict_rows.numel():
                        self._run.unflushed = True
                    m.rows = self._stores[t].exchange(m.evict_rows, m.evicted, m.load_rows, m.buffer[:n_load])
                m.evicted = None
            m.move_seconds = time.perf_counter() - t0

    def _unpack(self, job: _Step) -> None:
        """Copies a moved step's rows into their slots (the consumer thread, before the
        step computes or anything reads the slots). Idempotent."""
        for m in job.moves:
            t = m.table
            counters = self._counters[t]
            codec = self._codecs[t]
            t0 = time.perf_counter()
            n_load = m.load_rows.numel()
            counters.rows_written_back += m.evict_rows.numel()
            counters.rows_loaded += n_load
            if n_load:
                rows = m.rows
                ready = m.load_slots < self._tbe_rows[t]
                if bool(ready.all()):
                    codec.scatter(self._weights[t], self._states[t], m.load_slots, rows)
                else:  # overflow slots past the TBE: filled once it grows, between steps
                    codec.scatter(self._weights[t], self._states[t], m.load_slots[ready], rows[ready])
                    self._deferred.append(_Deferred(t, m.load_slots[~ready], m.load_rows[~ready], rows[~ready]))
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
            buf = torch.empty((n + n // 2, self._codecs[t].layout.row_width), dtype=self._codecs[t].dtype)
        return buf

    def _finish(self, job: _Step) -> None:
        """Waits for the job's row moves and copies its rows into their slots; grows the
        TBE (between steps) if the cache overflowed."""
        t0 = time.perf_counter()
        try:
            self._pipeline.wait(job.ticket)
            self._run.wait_seconds += time.perf_counter() - t0
            self._unpack(job)
        except BaseException as e:
            self._broken = f"a prefetch failed ({type(e).__name__}: {e})"
            raise
        if self._deferred:  # a load went to an overflow slot past the TBE
            self._drain()
            self._grow_tbe()

    def _drain(self) -> None:
        """Waits for every queued job and puts its rows in their slots."""
        for job in list(self._pending):
            try:
                self._pipeline.wait(job.ticket)
                self._unpack(job)
            except BaseException as e:
                self._broken = f"a prefetch failed ({type(e).__name__}: {e})"
                raise

    @contextlib.contextmanager
    def _naming(self, t: int):
        """Re-raises a store's OSError (a full disk, a failed or corrupt read; its message
        names the file) with the table and tier in front, keeping its type and errno."""
        try:
            yield
        except OSError as e:
            raise type(e)(e.errno, f"table {self.table_names[t]} on {self.tiers[t].name}: {e.strerror or e}") from e

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("TieredEmbeddingBags is closed")
        if self._broken is not None:
            raise RuntimeError(
                f"TieredEmbeddingBags is unusable: {self._broken}; the cache may no longer match "
                "the tier. Rebuild the module and restore the last checkpoint."
            )

    # ------------------------------------------------------- whole-table access ----
    def flush(self, *, steps_done: bool = False) -> None:
        """Writes every dirty cached row (weights + optimizer state) to its tier and makes
        the tier durable (fsync / msync).

        Args:
            steps_done: the backward of every step computed so far has run (the caller is
                between training steps), so the rows of the last one are clean once
                written; otherwise they stay dirty, as its update may still come.
        """
        self._check_usable()
        self._drain()
        if not self._run.unflushed:
            return  # nothing changed since a flush that left every row on the tier
        live = max(0, self._run.last_forward_step + (1 if steps_done else 0))
        for t in range(len(self.embedding_specs)):
            rows, slots = self._index.take_dirty(t, live)
            ready = slots < self._tbe_rows[t]
            rows, slots = rows[ready], slots[ready]
            with self._naming(t):
                # In chunks: a cache of millions of dirty rows would otherwise be copied
                # whole (and queued whole in the store) at once.
                for start in range(0, rows.numel(), _FLUSH_CHUNK_ROWS):
                    chunk = slice(start, start + _FLUSH_CHUNK_ROWS)
                    self._stores[t].write(
                        rows[chunk], self._codecs[t].gather(self._weights[t], self._states[t], slots[chunk]))
                    self._counters[t].rows_written_back += rows[chunk].numel()
                self._stores[t].flush()
            fault_point("flush.table")
        self._run.unflushed = not steps_done  # else rows of a step still running stay dirty

    def set_rows(
        self,
        table: int,
        ids: torch.Tensor,
        weights: torch.Tensor,
        optimizer_state: Optional[torch.Tensor] = None,
    ) -> None:
        """Overwrites rows ``ids`` of ``table`` (weights ``[n, dim]`` in the weights' dtype,
        optimizer state in FBGEMM's layout: ``[n]`` row-wise, ``[n, dim]`` per element; zero
        when omitted) on the tier and in the cache. For initialising or restoring tables."""
        self._check_usable()
        if not 0 <= table < len(self.embedding_specs):
            raise IndexError(f"table {table} is outside [0, {len(self.embedding_specs)})")
        name, (rows_t, dim) = self.table_names[table], self.embedding_specs[table]
        codec = self._codecs[table]
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
        rows = rows.contiguous()
        self._drain()
        self._run.unflushed = True
        self._stores[table].write(ids, rows)
        self._dirty[table].mark(ids)
        # The new row of each given id, the last occurrence winning as in the store.
        order = torch.argsort(ids, stable=True)
        sorted_ids = ids[order]

        def new_rows_of(row_ids: torch.Tensor) -> torch.Tensor:
            return rows[order[torch.searchsorted(sorted_ids, row_ids, right=True) - 1]]

        cached_rows, slots = self._index.occupied(table)
        hit = torch.isin(cached_rows, ids) & (slots < self._tbe_rows[table])
        if bool(hit.any()):
            codec.scatter(self._weights[table], self._states[table], slots[hit], new_rows_of(cached_rows[hit]))
        for d in self._deferred:  # rows waiting for the TBE to grow
            if d.table == table:
                hit = torch.isin(d.ids, ids)
                if bool(hit.any()):
                    d.rows[hit] = new_rows_of(d.ids[hit])

    def _full_rows(self, t: int, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Rows ``[start, stop)`` of table t as store rows: read through the tier, overlaid
        with the cached rows."""
        self._drain()
        stop = self.embedding_specs[t][0] if stop is None else stop
        codec = self._codecs[t]
        out = torch.empty((stop - start, codec.layout.row_width), dtype=codec.dtype)
        for lo in range(start, stop, _READ_CHUNK_ROWS):
            ids = torch.arange(lo, min(stop, lo + _READ_CHUNK_ROWS))
            out[lo - start : lo - start + ids.numel()] = self._stores[t].read(ids)
        self._overlay_cached(t, torch.arange(start, stop), out)
        return out

    def _overlay_cached(self, t: int, ids: torch.Tensor, out: torch.Tensor) -> None:
        """Overwrites ``out`` (rows ``ids`` of table t as the tier holds them) with the cached
        copy of each row the cache holds, which may be newer. Rows of deferred (overflow)
        loads came from the tier, which is still current for them."""
        if not self._run.unflushed:
            return  # the tier holds every row as the cache does
        cached, slots = self._index.occupied(t)
        keep = slots < self._tbe_rows[t]
        cached, slots = cached[keep], slots[keep]
        hit = torch.isin(ids, cached)
        if bool(hit.any()):
            order = torch.argsort(cached)
            where = order[torch.searchsorted(cached[order], ids[hit])]
            with torch.no_grad():
                out[hit] = self._codecs[t].gather(self._weights[t], self._states[t], slots[where])

    def read_rows(self, table: int, start: int, stop: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rows ``[start, stop)`` of ``table``: weights ``[n, dim]`` and optimizer state in
        FBGEMM's layout (``[n]`` row-wise, ``[n, dim]`` per element, None for SGD), read
        through every tier. Lets a caller stream a table larger than memory in pieces."""
        self._check_usable()
        if not 0 <= table < len(self.embedding_specs):
            raise IndexError(f"table {table} is outside [0, {len(self.embedding_specs)})")
        rows_t = self.embedding_specs[table][0]
        if not 0 <= start <= stop <= rows_t:
            raise IndexError(f"table {self.table_names[table]}: rows [{start}, {stop}) outside [0, {rows_t})")
        weights, state = self._codecs[table].split(self._full_rows(table, start, stop))
        if state is None:  # SGD: no state
            return weights.clone(), None
        return weights.clone(), state.clone()

    def split_embedding_weights(self) -> List[torch.Tensor]:
        """Each table's full weights ``[rows, dim]`` (copies, read through every tier)."""
        return [self._codecs[t].split(self._full_rows(t))[0].clone() for t in range(len(self.embedding_specs))]

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        """Each table's optimizer state in FBGEMM's layout (``[[momentum]]`` per table;
        ``[]`` for SGD, as FBGEMM returns)."""
        if self._codecs[0].layout.state_values == 0:
            return []
        return [[self._codecs[t].split(self._full_rows(t))[1].clone()] for t in range(len(self.embedding_specs))]

    def cache_stats(self) -> Dict[str, Dict[str, float]]:
        """Per table: lookups, unique rows, hits, misses, hit_rate, evictions, rows and bytes
        moved to and from the tier, seconds moving rows (tier I/O, packing); plus, the same
        in every table's entry as they are the kernel's: seconds planning (the cache index of
        every table, one call per step), forward's wait for prefetches and how many
        forwards found their rows prefetched."""
        out: Dict[str, Dict[str, float]] = {}
        capacities = self._index.capacities()
        for t, name in enumerate(self.table_names):
            c = dict(self._index.counters(t))
            k = self._counters[t]
            unique = max(1, c["unique_rows"])
            row_bytes = self._codecs[t].layout.row_bytes
            out[name] = {
                **{key: float(v) for key, v in c.items()},
                "hit_rate": c["hits"] / unique,
                "rows_loaded": float(k.rows_loaded),
                "rows_written_back": float(k.rows_written_back),
                "bytes_read_from_tier": float(k.rows_loaded * row_bytes),
                "bytes_written_to_tier": float(k.rows_written_back * row_bytes),
                "plan_seconds": self._run.plan_seconds,
                "tier_seconds": k.tier_seconds,
                "cache_capacity_rows": float(capacities[t]),
                "prefetch_wait_seconds": self._run.wait_seconds,
                "steps_prefetched": float(self._run.steps_prefetched),
            }
        return out

    def store_stats(self, table: int) -> Dict[str, object]:
        """The backing store's own ``stats()`` for ``table`` (an index): for SSD tables the
        block store's I/O counters, latencies and write amplification."""
        if isinstance(table, bool) or not isinstance(table, int) or not 0 <= table < len(self._stores):
            raise IndexError(f"table={table!r} must be an index in [0, {len(self._stores)})")
        return self._stores[table].stats()

    def close(self) -> None:
        """Flushes, stops the prefetch threads and closes the stores. Idempotent.

        A process that ends without it (normally, by ``sys.exit``, an exception, Ctrl-C or a
        signal handler raising ``SystemExit``) does not flush: prefetches not started are
        dropped, the running one completes, the threads are joined and the stores closed at
        exit (kernels/lifetime.py), so the exit code is Python's and every flushed row stays."""
        if self._closed:
            return
        if self._broken is None:
            self.flush()
        self._resources.close()
        self._closed = True


_NO_STATE = torch.empty(0)  # a table without optimizer state, in plan calls


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over the same memory as ``t`` with a version counter of its own."""
    with torch.no_grad():
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _same(a: torch.Tensor, b: object) -> bool:
    return a is b or (isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b.to(torch.int64)))
