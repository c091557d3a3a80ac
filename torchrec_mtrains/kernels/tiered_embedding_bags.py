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

This module is the kernel's face: its settings, construction and public methods. The parts
it composes, each given what it needs: ``slots.py`` (the TBE over the cache slots),
``row_cache.py`` (what the parts share), ``steps.py`` (a step's rows into their slots),
``table_rows.py`` (whole tables through the tiers) and ``checkpoint_rows.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.kernels.batch import (
    BatchSizes,
    check_embedding_specs,
    check_feature_table_map,
    check_index_tensor,
)
from torchrec_mtrains.kernels.checkpoint_rows import CheckpointRows
from torchrec_mtrains.kernels.config import DEFAULTS, TieredConfig, resolve_config
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.lifetime import KernelResources
from torchrec_mtrains.kernels.hooks import EngineHooks
from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.kernels.row_codec import RowCodec
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot
from torchrec_mtrains.kernels.row_weights import RowWeights
from torchrec_mtrains.kernels.slots import CacheSlots
from torchrec_mtrains.kernels.steps import StepPath
from torchrec_mtrains.kernels.table_rows import TableRows
from torchrec_mtrains.kernels.tier_stores import StoreSpec, create_store
from torchrec_mtrains.kernels.stage_threads import stage_threads_pay
from torchrec_mtrains.kernels.virtual_rows import VirtualRows, VirtualTableSpec
from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.storage import BlockStore, RowStore
from torchrec_mtrains.testing.faults import fault_point
from torchrec_mtrains.types import Tier

__all__ = ["TieredEmbeddingBags"]

_SETTINGS = frozenset(f.name for f in dataclasses.fields(TieredConfig))


def _setting(name: str) -> property:
    """A read-only attribute that is the kernel config's ``name``: one home for each setting."""
    return property(lambda self: getattr(self.config, name), doc=f"``config.{name}``.")


class TieredEmbeddingBags(torch.nn.Module):
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
        optimizer: EXACT_ROWWISE_ADAGRAD (the default here), EXACT_ADAGRAD or EXACT_SGD
            (fused, FBGEMM's): every optimizer FBGEMM's CPU TBE trains except
            EMAINPLACE_ROWWISE_ADAGRAD, whose EMA pass rewrites every row of every table;
            and ADAM, PARTIAL_ROWWISE_ADAM, LAMB and PARTIAL_ROWWISE_LAMB, which FBGEMM's CPU
            TBE refuses, with FBGEMM's definitions (``adam_family.py``: beta1, beta2 and
            weight_decay are ``tbe_settings``).
        learning_rate, eps: optimizer hyper-parameters.
        pooling_mode: PoolingMode.SUM or PoolingMode.MEAN (bags: one row per bag), or
            PoolingMode.NONE (sequences, TorchRec's EmbeddingCollection: one output row per
            id, ``[len(indices), dim]``; every table of one dim).
        cache_algorithm: "lru", "lfu" or "tinylfu" (LFU behind a TinyLFU admission filter).
        prefetch_pipeline: run each step's plan and moves on the kernel's own threads (True,
            the default) or inline in ``prefetch()`` (False); None: threads where they pay
            (``stage_threads.py``: with an SSD table, or with CPUs to spare beside torch's
            threads), else inline -- what sharded tables use. ``stage_threads`` says which
            the kernel runs.
        weights_precision: SparseType.FP32 or SparseType.FP16.
        cache_ways: ways per cache set (default 32, at most 1024).
        init_range: initial weights are uniform(lo, hi), one pair for all tables or one
            per table; default ``(-1/sqrt(rows), 1/sqrt(rows))`` per table as in TorchRec.
        seed: seeds the initial weights (a pure function of seed, table and row).
        table_names: names used in file names, errors and stats (default "table_<t>").
        ssd_dram_cache_mb: DRAM cache of each SSD block store, under the row cache, in MiB.
        feature_table_map: FBGEMM's: the table of each feature (non-decreasing), when
            tables have several features; offsets then have ``F * B + 1`` entries.
        virtual_tables: per table, a ``VirtualTableSpec`` (a virtual table: its ids are
            keys in ``[0, id_space)``, each live id its own row, made on first lookup and
            evicted by its policy; its ``num_rows`` is how many live ids it holds) or None
            (a dense table). See ``virtual_rows.py``.
        tbe_settings: more keywords of FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``,
            passed to the kernel's TBE as given (gradient clipping, weight decay, output
            dtype, ...); the keywords it cannot honour are refused with the reason
            (``tbe_settings.py`` lists each keyword's fate).
        dense_slot_map: whether every table's cache index keeps a dense row-to-slot map (4
            bytes of host DRAM per table row, for a faster plan of the same slots): None
            (default) keeps one where the rule of ``torchrec_mtrains/slot_map.py`` finds it
            pays (its bytes at most an eighth of the cache slots' row bytes), True or False
            for every table.
        lookahead: the look-ahead window, in batches (default 0: none). With k, the plan of
            a batch waits until the k batches after it are prefetched (or until ``forward``
            needs it), and evicts no row those batches use: keep ``k + 1`` batches prefetched
            ahead of ``forward`` (``TieredTrainPipeline(lookahead=k)`` does). Changes which
            rows stay cached, never a result. See docs/kernels.md.
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
        prefetch_pipeline: Optional[bool] = DEFAULTS.prefetch_pipeline,
        *,
        weights_precision: SparseType = DEFAULTS.weights_precision,
        cache_ways: int = DEFAULTS.cache_ways,
        init_range: Optional[Union[Tuple[float, float], Sequence[Tuple[float, float]]]] = DEFAULTS.init_range,
        seed: int = DEFAULTS.seed,
        table_names: Optional[Sequence[str]] = DEFAULTS.table_names,
        ssd_dram_cache_mb: float = DEFAULTS.ssd_dram_cache_mb,
        feature_table_map: Optional[Sequence[int]] = DEFAULTS.feature_table_map,
        virtual_tables: Optional[Sequence[Optional[VirtualTableSpec]]] = DEFAULTS.virtual_tables,
        tbe_settings: Optional[Mapping[str, Any]] = DEFAULTS.tbe_settings,
        dense_slot_map: Optional[bool] = DEFAULTS.dense_slot_map,
        lookahead: int = DEFAULTS.lookahead,
        config: Optional[TieredConfig] = None,
    ) -> None:
        # The settings' arguments by name, taken before any other local exists.
        settings = {name: value for name, value in locals().items() if name in _SETTINGS}
        super().__init__()
        load_extension()
        specs = check_embedding_specs(embedding_specs)
        config = resolve_config(config, settings)
        if config.pooling_mode == PoolingMode.NONE and len({dim for _, dim in specs}) > 1:
            raise ValueError(f"pooling_mode=PoolingMode.NONE (a row per id) needs tables of one dim, got dims "
                             f"{sorted({dim for _, dim in specs})} (FBGEMM's sequence TBE); give each dim a kernel")
        num_rows = [rows for rows, _ in specs]
        self.config = config
        self.embedding_specs = specs
        self.table_names = config.names(len(specs))
        self.tiers = config.tiers(len(specs))  # each table's
        self.feature_table_map = check_feature_table_map(config.feature_table_map, len(specs))
        self.cache_rows = config.cache_sizes(num_rows)
        codecs = [RowCodec(config.layout(dim)) for _, dim in specs]
        self._init_ranges = config.init_ranges(num_rows)
        virtual_specs = config.virtual_specs(len(specs))
        keyed = [spec is not None for spec in virtual_specs]  # a virtual table's cache is keyed by its ids
        dense_maps = [use and not by_id for use, by_id in zip(
            config.dense_maps(num_rows, self.cache_rows, [codec.layout.row_bytes for codec in codecs]), keyed)]
        stores = self._create_stores(codecs)
        # Every table's cache index, planned in one C++ call per step.
        index = torch.classes.mtrains.KernelCacheIndex(list(self.cache_rows), num_rows, dense_maps, config.cache_ways,
                                                       config.cache_algorithm, keyed)
        slots = CacheSlots(specs, config, codecs, self.feature_table_map,
                           [n + max(config.cache_ways, n // 8) for n in self.cache_rows])
        # A submodule, for train()/eval() and state_dict(); replaced when the cache outgrows it.
        self._tbe = slots.tbe
        # Moves a step's rows between the slots and every table's store, one C++ call a step.
        mover = torch.classes.mtrains.StepMover(len(specs))
        virtual = VirtualRows(virtual_specs, num_rows, self.table_names, index)
        tier_wrappers = {t: self._virtual_wrapper(virtual, mover, t, codecs[t]) for t in virtual.tables}
        for t, store in enumerate(stores):
            store.attach_to(mover, t)
            if t in tier_wrappers:
                tier_wrappers[t]()
        # The parts below refer to one another, never to this module: the exit hook must let
        # it be collected.
        self._cache = RowCache(self.table_names, self.tiers, specs, codecs, stores, index, slots, mover,
                               virtual, tier_wrappers)
        # Runs every step's plan and moves on C++ threads (csrc/kernel/step_engine.h).
        hooks = EngineHooks(self._cache)
        self.stage_threads = (stage_threads_pay(self.tiers) if config.prefetch_pipeline is None
                              else config.prefetch_pipeline)
        engine = torch.classes.mtrains.StepEngine(index, mover, [bound for bound, _ in self._cache.id_specs],
                                                  self.feature_table_map or [], self.stage_threads,
                                                  hooks.addresses(), virtual.ids if virtual else None)
        engine.set_slots(slots.weights, slots.move_states)
        engine.set_lookahead(config.lookahead)
        engine.set_dirty_bitmaps(self._cache.dirty_bits)
        self._cache.engine = engine
        # Stops the engine's threads and closes the stores at close(), collection or exit.
        self._resources = KernelResources(self, engine, hooks, stores, self.table_names, mover)
        self._steps = StepPath(self._cache, engine, hooks, self.feature_table_map)
        virtual.set_weight_reader(RowWeights(self._cache, engine))  # the L2-norm policy's
        self._rows = TableRows(self._cache, self._steps.drain)
        self._checkpoint = CheckpointRows(self._cache, self._rows, self._steps, config.ssd_dram_cache_mb)

    def _create_stores(self, codecs: List[RowCodec]) -> List[RowStore]:
        """Each table's backing store on the tier, its rows initialised from its init range."""
        config = self.config
        return [
            create_store(
                self.tiers[t],
                StoreSpec(
                    name=self.table_names[t], num_rows=rows, row_width_dim=dim,
                    state_slots=codecs[t].layout.state_slots, dtype=codecs[t].dtype,
                    init_range=self._init_ranges[t], seed=self.store_seed(t), storage_dir=config.storage_dir,
                    ssd_dram_cache_mb=config.ssd_dram_cache_mb,
                ),
            )
            for t, (rows, dim) in enumerate(self.embedding_specs)
        ]

    def _virtual_wrapper(self, virtual: VirtualRows, mover: torch.ScriptObject, t: int, codec: RowCodec):
        """Makes table t's tier in ``mover`` virtual; called again after each attach."""
        layout = codec.layout
        seed, init_range = self.store_seed(t), self._init_ranges[t]

        def wrap() -> None:
            virtual.attach(mover, t, seed, init_range, layout.dim, layout.state_slots, codec.dtype)
        return wrap

    @property
    def dense_slot_maps(self) -> List[bool]:
        """Whether each table's cache index keeps a dense row-to-slot map
        (``config.dense_slot_map``, else the rule of ``torchrec_mtrains/slot_map.py``)."""
        return list(self._cache.index.dense_maps())

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
        return [codec.layout for codec in self._cache.codecs]

    @property
    def weights_dtype(self) -> torch.dtype:
        """The torch dtype of every table's weights (float32 or float16)."""
        return self._cache.codecs[0].dtype

    def get_learning_rate(self) -> float:
        """The learning rate the fused optimizer applies: the float32 FBGEMM's TBE holds
        (0.009999999776482582 for 0.01), as FBGEMM's ``get_learning_rate`` returns it."""
        return self._cache.slots.tbe.get_learning_rate()

    def set_learning_rate(self, learning_rate: float) -> None:
        """Sets the fused optimizer's learning rate for the next steps (kept if the TBE
        is rebuilt to grow its cache).

        Raises:
            ValueError: ``learning_rate`` is not a finite number >= 0.
        """
        self.config = dataclasses.replace(self.config, learning_rate=learning_rate)
        self._cache.slots.set_learning_rate(self.learning_rate)

    # ------------------------------------------------------------------- steps ----
    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor,
                 batch_size_per_feature_per_rank: Optional[BatchSizes] = None) -> None:
        """Starts loading the rows of the batch that the next ``forward`` (after any already
        prefetched) will compute, so the tier I/O overlaps the current step.

        Each prefetched batch must be the next one given to ``forward``, in order: call
        ``prefetch(b0)`` once, then each step ``out = emb(b_i)``, ``prefetch(b_{i+1})``,
        ``backward``. A caller whose next batch changed drops its prefetches with
        ``cancel_prefetch()``. ``batch_size_per_feature_per_rank`` as ``forward`` takes it."""
        self._cache.check_usable()
        self._check_variable_batch(batch_size_per_feature_per_rank)
        self._steps.prefetch(indices, offsets, self.training, batch_size_per_feature_per_rank)

    @property
    def pending_prefetches(self) -> int:
        """Batches given to ``prefetch`` that no ``forward`` has computed yet."""
        return self._steps.pending

    def cancel_prefetch(self) -> int:
        """Drops every pending prefetch, so the next ``forward`` may take any batch.

        The rows already on their way are still put in the cache (a prefetch's row moves
        cannot be undone: its evicted rows are written back as usual), so nothing is lost and
        they serve later steps that look them up. Returns how many prefetches were dropped."""
        self._cache.check_usable()
        return self._steps.cancel()

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: Optional[torch.Tensor] = None,
        batch_size_per_feature_per_rank: Optional[BatchSizes] = None,
    ) -> torch.Tensor:
        """Pooled embeddings ``[B, sum(dims)]`` of a batch (FBGEMM's layout).

        ``batch_size_per_feature_per_rank`` (FBGEMM's, variable batch per feature): the bags
        of each feature from each rank; offsets then have one entry per bag plus one, and
        the output is FBGEMM's VBE output, 1-D, rank by rank, feature by feature within a
        rank. Bags only (not ``PoolingMode.NONE``)."""
        self._cache.check_usable()
        self._check_variable_batch(batch_size_per_feature_per_rank)
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
        if self._cache.slots.adam is not None:
            self._cache.slots.adam.check_weights(per_sample_weights, self.training)
        remapped = self._steps.take(indices, offsets, self.training, batch_size_per_feature_per_rank)
        fault_point("forward")
        slots = self._cache.slots
        tbe = slots.tbe
        if tbe is not self._tbe:  # the cache outgrew the TBE, which was rebuilt larger
            self._tbe = tbe
        batch_sizes = (None if batch_size_per_feature_per_rank is None
                       else [list(b) for b in batch_size_per_feature_per_rank])

        def lookup() -> torch.Tensor:
            if batch_sizes is None:
                return tbe(remapped, offsets, per_sample_weights)
            return tbe(remapped, offsets, per_sample_weights, batch_size_per_feature_per_rank=batch_sizes)

        if slots.adam is None:
            return lookup()
        return slots.adam.lookup(slots, lookup, remapped, offsets, per_sample_weights, batch_sizes, self.training)

    @property
    def optimizer_step(self) -> int:
        """The step count of an Adam-family optimizer's bias correction (FBGEMM's ``iter``:
        forwards so far); 0 for the other optimizers, which keep none."""
        adam = self._cache.slots.adam
        return 0 if adam is None else adam.step

    def set_optimizer_step(self, step: int) -> None:
        """Sets the Adam-family step count (FBGEMM's ``set_optimizer_step``), as a
        checkpoint's restore does; the next forward counts ``step + 1``.

        Raises:
            ValueError: a negative or non-integer step, or an optimizer without a step count.
        """
        adam = self._cache.slots.adam
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r} must be an integer >= 0")
        if adam is None:
            if step:
                raise ValueError(f"optimizer {self.optimizer.name} keeps no step count (only the Adam family's "
                                 "bias correction counts steps)")
            return
        adam.step = step

    def _check_variable_batch(self, batch_size_per_feature_per_rank: Optional[BatchSizes]) -> None:
        if batch_size_per_feature_per_rank is not None and self.pooling_mode == PoolingMode.NONE:
            raise ValueError("batch_size_per_feature_per_rank (a variable batch per feature) is for pooled bags; "
                             "this kernel's pooling_mode is PoolingMode.NONE (a row per id)")

    # ------------------------------------------------------- whole-table access ----
    def flush(self, *, steps_done: bool = False, durable: bool = True,
              tables: Optional[Sequence[int]] = None) -> None:
        """Writes every dirty cached row (weights + optimizer state) to its tier and makes
        the tier durable (fsync / msync).

        Args:
            steps_done: the backward of every step computed so far has run (the caller is
                between training steps), so the rows of the last one are clean once
                written; otherwise they stay dirty, as its update may still come.
            durable: make the tiers durable too; False leaves that to the tiers (a
                checkpoint that copies the rows, or pins an SSD store's, needs only them
                written to the tier).
            tables: only these tables (default: every one).
        """
        self._rows.flush(steps_done, durable, tables)

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
        self._rows.set_rows(table, ids, weights, optimizer_state)

    def read_rows(self, table: int, start: int, stop: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rows ``[start, stop)`` of ``table``: weights ``[n, dim]`` and optimizer state in
        FBGEMM's layout (``[n]`` row-wise, ``[n, dim]`` per element, None for SGD), read
        through every tier. Lets a caller stream a table larger than memory in pieces."""
        return self._rows.read_rows(table, start, stop)

    def virtual_ids(self, table: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ids, rows) of every live id of virtual table ``table``, by row, with the ids of
        the steps prefetched so far mapped (their plans, which map new ids and run eviction
        passes, are waited for: two calls between steps see the same ids).

        Raises:
            ValueError: ``table`` is not a virtual table.
        """
        virtual = self._virtual(table)
        self._steps.drain()
        return virtual.entries(table)

    def virtual_state(self, table: int) -> Dict[str, Any]:
        """What a checkpoint saves of virtual table ``table`` besides its rows, between
        steps: ``ids``, ``rows`` (by row), their ``counts`` and ``times`` (the policy's
        metadata), ``pending`` (steps prefetched, not computed: their ids are mapped, so a
        restore replays them without counting them again) and ``next_pass_at``. The rows the
        pending steps gave to new ids are marked changed (``dirty_rows``).

        Raises:
            ValueError: ``table`` is not a virtual table.
        """
        virtual = self._virtual(table)
        self._cache.check_usable()
        self._steps.drain()
        self._steps.mark_pending_created()
        ids, rows = virtual.entries(table)
        counts, times = virtual.metadata(table, rows)
        return {"ids": ids, "rows": rows, "counts": counts, "times": times,
                "pending": self._steps.pending, "next_pass_at": virtual.next_pass_at(table)}

    def virtual_capacity(self, table: int) -> int:
        """The live ids virtual table ``table`` can hold: its rows."""
        return self._virtual(table).tables[table].rows

    def restore_virtual(self, table: int, ids: torch.Tensor, counts: torch.Tensor, times: torch.Tensor,
                        replay: int = 0, next_pass_at: Optional[int] = None) -> torch.Tensor:
        """Makes virtual table ``table`` hold exactly ``ids`` (distinct, in its id space) with
        that metadata, id i in row i (returned); write their rows with ``set_store_rows``.
        ``replay`` and ``next_pass_at`` as ``virtual_state`` gave them (see
        ``VirtualRows.restore``).

        Raises:
            ValueError: not a virtual table; more ids than its rows; an id outside its
                space; a prefetched step is pending.
        """
        virtual = self._virtual(table)
        self._cache.check_usable()
        if self._steps.pending:
            raise ValueError(f"table {self.table_names[table]}: restore a virtual table only with no prefetched "
                             "step pending")
        ids = check_index_tensor("ids", ids)
        bound = self._cache.id_specs[table][0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= bound):
            raise ValueError(f"table {self.table_names[table]}: ids must lie in [0, {bound})")
        return virtual.restore(table, ids, counts, times, replay, next_pass_at)

    def read_ids(self, table: int, ids: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rows ``ids`` of virtual table ``table`` as ``read_rows`` gives rows: weights and
        optimizer state, read through the cache and the tier; an id without a row reads as
        the initial value it would get. Changes nothing (no row is made).

        Raises:
            ValueError: ``table`` is not a virtual table.
            IndexError: an id outside the table's id space.
        """
        virtual = self._virtual(table)
        ids = check_index_tensor("ids", ids)
        bound = self._cache.id_specs[table][0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= bound):
            raise IndexError(f"table {self.table_names[table]}: ids must lie in [0, {bound})")
        codec = self._cache.codecs[table]
        layout, (lo, hi) = codec.layout, self._init_ranges[table]
        self._steps.drain()  # no eviction pass may run between the lookup and the read
        rows = virtual.find(table, ids)
        out = torch.ops.mtrains.lazy_init_rows(ids + virtual.tables[table].spec.id_offset, layout.dim,
                                               layout.state_slots, self.store_seed(table), lo, hi, codec.dtype)
        present = rows >= 0
        if bool(present.any()):
            out[present] = self._checkpoint.store_rows(table, rows[present])
        weights, state = codec.split(out)
        return weights.clone(), None if state is None else state.clone()

    def _virtual(self, table: int) -> VirtualRows:
        self._cache.check_table(table)
        if table not in self._cache.virtual.tables:
            raise ValueError(f"table {self.table_names[table]} is not a virtual table")
        return self._cache.virtual

    def split_embedding_weights(self) -> List[torch.Tensor]:
        """Each table's full weights ``[rows, dim]`` (copies, read through every tier)."""
        return self._rows.split_embedding_weights()

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        """Each table's optimizer state in FBGEMM's layout (``[momentum]`` per table, Adam
        and LAMB ``[momentum1, momentum2]``; ``[]`` for SGD, as FBGEMM returns)."""
        return self._rows.split_optimizer_states()

    def cache_stats(self) -> Dict[str, Dict[str, float]]:
        """Per table: lookups, unique rows, hits, misses, hit_rate, evictions, rows and bytes
        moved to and from the tier, seconds moving rows (tier I/O, packing); plus, the same
        in every table's entry as they are the kernel's: seconds planning (the cache index of
        every table, one call per step), forward's wait for prefetches and how many
        forwards found their rows prefetched."""
        return self._cache.stats()

    def store_stats(self, table: int) -> Dict[str, object]:
        """The backing store's own ``stats()`` for ``table`` (an index): for SSD tables the
        block store's I/O counters, latencies and write amplification."""
        stores = self._cache.stores
        if isinstance(table, bool) or not isinstance(table, int) or not 0 <= table < len(stores):
            raise IndexError(f"table={table!r} must be an index in [0, {len(stores)})")
        self._cache.count_moved(table)
        return stores[table].stats()

    # ------------------------------------------------------- checkpoint access ----
    def dirty_rows(self, table: int) -> DirtyRows:
        """The rows of ``table`` that training forwards looked up (so may have changed) or
        ``set_rows`` wrote since the last ``clear_dirty()``; after ``flush()`` their values
        are on the tier."""
        return self._checkpoint.dirty_rows(table)

    def clear_dirty(self) -> None:
        """Forgets which rows were written (a checkpoint now holds them)."""
        self._checkpoint.clear_dirty()

    def written_ids(self, table: int, start: int, stop: int) -> torch.Tensor:
        """Ids in ``[start, stop)`` of the rows of ``table`` that may differ from their
        initial value (``lazy_init_rows`` of ``store_seed(table)``) once ``flush()`` wrote
        the cache's changes to the tier: those the tier holds as written."""
        return self._checkpoint.written_ids(table, start, stop)

    def store_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of ``table`` as the tier stores them (``[n, row_width]``: weights,
        then the optimizer state's bytes), read through the tier and the cache."""
        return self._checkpoint.store_rows(table, ids)

    def snapshot_rows(self, table: int, selected: DirtyRows, add_cached: bool = False) -> RowSnapshot:
        """Rows ``selected`` of ``table`` as they are now (between steps; ``add_cached``:
        the rows the cache holds are selected too), readable through the returned snapshot
        while training goes on: the cached ones are copied now, and every write to the tier
        keeps the old value of a selected row the snapshot has not read yet (copy-on-write)
        until ``release_snapshot(table)``. No flush is needed. For checkpoints."""
        return self._checkpoint.snapshot_rows(table, selected, add_cached)

    def release_snapshot(self, table: int) -> None:
        """Ends ``table``'s snapshot (and drops the rows it kept); no-op without one."""
        self._checkpoint.release_snapshot(table)

    def set_store_rows(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrites rows ``ids`` of ``table`` with rows as ``store_rows`` returns them."""
        self._checkpoint.set_store_rows(table, ids, rows)

    def linkable_store(self, table: int) -> Optional[BlockStore]:
        """The block store of ``table`` when a checkpoint can link its file instead of
        copying its rows (an SSD table on one file: a striped log names its other files by
        path, which a link cannot carry); else None. Flush first: the store then holds
        every row."""
        return self._checkpoint.linkable_store(table)

    def adopt_store_file(self, table: int, source: str, ids: torch.Tensor, locations: torch.Tensor,
                         pin_tag: int) -> BlockStore:
        """Makes the file ``source`` (a checkpoint's link to an earlier store file of this
        table) the table's store, its rows being exactly the location map ``ids`` ->
        ``locations``, and pins them under ``pin_tag``; the table's cached rows are dropped
        unwritten. The current store is closed and its path linked to ``source`` instead."""
        return self._checkpoint.adopt_store_file(table, source, ids, locations, pin_tag)

    def close(self) -> None:
        """Flushes, stops the prefetch threads and closes the stores. Idempotent.

        A process that ends without it (normally, by ``sys.exit``, an exception, Ctrl-C or a
        signal handler raising ``SystemExit``) does not flush: prefetches not started are
        dropped, the running one completes, the threads are joined and the stores closed at
        exit (kernels/lifetime.py), so the exit code is Python's and every flushed row stays."""
        cache = self._cache
        if cache.closed:
            return
        if cache.broken is None:
            self.flush()
        self._resources.close()
        cache.closed = True
