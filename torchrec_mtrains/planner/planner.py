"""StorageAwarePlanner: a drop-in for TorchRec's EmbeddingShardingPlanner built on its
planner interfaces. placement.py puts each table on a tier with a cache size (one knapsack
for the whole job); TieredEnumerator turns that into TorchRec sharding options (table-wise
and row-wise per table) whose storage (TieredStorage: HBM, DRAM, SCM, SSD) and perf the
tiered shard estimators fill in; TieredProposer proposes, TieredPartitioner spreads them
over ranks; TorchRec's ``to_sharding_plan`` makes the ShardingPlan, tiered tables as
TieredParameterSharding entries for TieredEmbeddingBagCollectionSharder (bags) and
TieredEmbeddingCollectionSharder (EmbeddingCollections: sequences, a row per id out)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch.distributed as dist
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_configs import DataType

from torchrec_mtrains.kernels.config import DEFAULT_CACHE_LOAD_FACTOR, MAX_LOOKAHEAD
from torchrec_mtrains.planner.adapters.enumerator import TieredEnumerator
from torchrec_mtrains.planner.adapters.partitioner import TieredPartitioner
from torchrec_mtrains.planner.adapters.proposer import TieredProposer
from torchrec_mtrains.planner.adapters.rank_caches import GrownCache, grow_rank_caches
from torchrec_mtrains.planner.adapters.shard_estimators import TieredPerfEstimator, TieredStorageEstimator
from torchrec_mtrains.planner.adapters.tiered_storage import torchrec_topology
from torchrec_mtrains.planner.constraints import constrained_table, is_key_value, key_value_entry
from torchrec_mtrains.planner.model.estimator import dense_step_seconds, kernel_step_seconds
from torchrec_mtrains.planner.model.lookahead import choose_lookahead
from torchrec_mtrains.planner.model.model_spec import ModelSpec, dense_spec_of, load_table_trace, parse_model_spec
from torchrec_mtrains.planner.model.optimizers import canonical_optimizer, trained_optimizer
from torchrec_mtrains.planner.model.placement import Placement, PlacementError, place
from torchrec_mtrains.planner.types import RankAssignment, TieredTopology
from torchrec_mtrains.planner.embedding_modules import embedding_modules
from torchrec_mtrains.planner.virtual_tables import as_virtual, virtual_live_ids
from torchrec_mtrains.types import Tier

__all__ = ["StorageAwarePlanner"]

_DEFAULT_LOCALITY = {"pooling_factor": 1.0, "zipf_alpha": 1.05}
# The shares of the job's compute tier that caches are sized for, one search each: caches
# sized for all of it may leave a table that only a split packs.
COMPUTE_TIER_SHARES = (1.0, 0.9, 0.8, 0.65, 0.5)
_DEFAULT_OPTIMIZER = "rowwise_adagrad"  # the tiered kernel's default (EXACT_ROWWISE_ADAGRAD)


class StorageAwarePlanner(ShardingPlanner):
    """Plans EmbeddingBagCollections and EmbeddingCollections (planned together) over the
    tiers of ``topology``. A sequence table's lookups are its sequence lengths
    (``pooling_factor``: ids a sample) and its output is a row per id.

    Args:
        topology: the node type (a TieredTopology, or a profile name / YAML path for
            ``load_topology``).
        batch_size: global batch size of a step.
        world_size: ranks (default: the process group's, else 1).
        target_qps: the throughput the tiers must feed (default: none -- tables are placed
            for capacity, hottest in the compute tier).
        locality: per table name, its pooling factor and one locality key (``zipf_alpha``,
            ``reuse_histogram`` or ``trace``), as in MODEL.yaml; tables not named get
            ``default_locality``.
        budget_bytes: caps on a tier's bytes for the whole job (e.g. {Tier.DRAM: 8 << 30}).
        storage_dir: where tiered tables keep their files (each rank a subdirectory).
        tiers: tiers the plan may use (default: all the node has).
        cache_algorithm: "lru", "lfu" or "tinylfu" (predicted with LFU's curve), for the caches
            and the predicted hit rates.
        optimizer: the optimizer whose state the rows hold: a short name ("rowwise_adagrad",
            "adagrad", "sgd") or FBGEMM's EmbOptimType value. Default: the one the sharders
            will train with (a table's ``apply_optimizer_in_backward`` optimizer, else the
            tiered sharder's ``fused_params["optimizer"]``), else "rowwise_adagrad"; given
            and different from theirs, ``plan`` raises ValueError (one layout per table).
        constraints: TorchRec's ParameterConstraints per table name (see constraints.py):
            ``compute_kernels=["key_value"]`` keeps a table on Tier.SSD with its
            KeyValueParams and CacheParams (load_factor, algorithm, stats), FBGEMM's kernels
            alone keep it whole in the compute tier, ``sharding_types`` limit its sharding.
        input_s_per_sample: CPU seconds the job's input pipeline spends per sample on the
            rank's cores (reading, decoding or generating batches); it lengthens the step
            like the dense part (0: free, or run elsewhere).
        lookahead: the tiered tables' look-ahead window in batches (``TieredParams.lookahead``);
            None (default): the plan picks it from the SSD tables' caches
            (planner/model/lookahead.py) and says so in ``last_lookahead``. Train with
            ``TieredTrainPipeline(lookahead=planner.last_lookahead)``.

    ``plan`` predicts the step of the slowest rank of its partition (``last_rank_step_s``,
    ``last_placement.predicted_qps``); ``place`` alone spreads the tables' cost evenly.
    """

    def __init__(
        self,
        topology: Union[TieredTopology, str],
        batch_size: int,
        world_size: Optional[int] = None,
        target_qps: Optional[float] = None,
        locality: Optional[Mapping[str, Mapping[str, Any]]] = None,
        default_locality: Mapping[str, Any] = _DEFAULT_LOCALITY,
        budget_bytes: Optional[Mapping[Tier, float]] = None,
        storage_dir: Optional[str] = None,
        tiers: Optional[Sequence[Tier]] = None,
        cache_algorithm: str = "lru",
        optimizer: Optional[str] = None,
        constraints: Optional[Mapping[str, ParameterConstraints]] = None,
        input_s_per_sample: float = 0.0,
        lookahead: Optional[int] = None,
    ) -> None:
        if lookahead is not None and (isinstance(lookahead, bool) or not isinstance(lookahead, int)
                                      or not 0 <= lookahead <= MAX_LOOKAHEAD):
            raise ValueError(f"lookahead={lookahead!r} must be None (the plan picks it) or an integer in "
                             f"[0, {MAX_LOOKAHEAD}]")
        if (isinstance(input_s_per_sample, bool) or not isinstance(input_s_per_sample, (int, float))
                or not 0 <= input_s_per_sample < float("inf")):
            raise ValueError(f"input_s_per_sample={input_s_per_sample!r} must be a finite number of seconds >= 0")
        if optimizer is not None:
            canonical_optimizer(optimizer)
        if isinstance(topology, str):
            from torchrec_mtrains.planner.hardware.topology import load_topology

            topology = load_topology(topology)
        self.topology = topology
        self.batch_size = batch_size
        self.world_size = world_size or (dist.get_world_size() if dist.is_initialized() else 1)
        self.target_qps = target_qps
        self.locality = dict(locality or {})
        self.default_locality = dict(default_locality)
        self.budget_bytes = dict(budget_bytes or {})
        self.storage_dir = storage_dir
        self.tiers = tiers
        self.cache_algorithm = cache_algorithm
        self.optimizer = optimizer
        self.constraints = dict(constraints or {})
        self.input_s_per_sample = float(input_s_per_sample)
        self.lookahead = lookahead
        self._trained_optimizer: Optional[str] = None  # what plan()'s sharders train with
        # What the last plan() decided, for reports.
        self.last_model: Optional[ModelSpec] = None
        self.last_placement: Optional[Placement] = None
        self.last_assignment: Dict[str, RankAssignment] = {}
        self.last_rank_step_s: List[float] = []
        self.last_grown_caches: List[GrownCache] = []  # caches grown into their rank's leftover bytes
        self.last_lookahead = 0  # the window the last plan gave its tiered tables

    # ------------------------------------------------------------------ planning ----
    def model_spec(self, module: nn.Module) -> ModelSpec:
        """The planner's view of every EBC table in ``module``. A virtual table is sized by
        its live ids (planner/virtual_tables.py): with a trace and no ``live_ids``, from the
        trace, read here once and handed on for its locality curve."""
        tables, dtypes, virtual = [], set(), {}
        # A TTL in steps: the steps a second the job is planned to run at, if it has a target.
        steps_per_second = self.target_qps / self.batch_size if self.target_qps else None
        for collection in embedding_modules(module):
            for config in collection.configs:
                loc = dict(self.locality.get(config.name, self.default_locality))
                rows = config.num_embeddings
                if config.use_virtual_table:
                    live_ids, trace = loc.pop("live_ids", None), None
                    if live_ids is None and "trace" in loc:
                        trace = loc["trace"] = load_table_trace(f"locality[{config.name!r}]", loc, self.batch_size)
                        loc.pop("trace_table", None)
                    rows = virtual[config.name] = virtual_live_ids(config, live_ids, self.world_size, trace,
                                                                   steps_per_second)
                tables.append({"name": config.name, "num_embeddings": rows,
                               "embedding_dim": config.embedding_dim, **loc,
                               **({"sequence": True} if collection.sequence else {})})
                dtypes.add("fp16" if config.data_type == DataType.FP16 else "fp32")
        if not tables:
            raise ValueError("the module has no EmbeddingBagCollection or EmbeddingCollection to plan")
        doc = {"batch_size": self.batch_size, "target_qps": self.target_qps or 1.0,
               "dtype": "fp16" if dtypes == {"fp16"} else "fp32", "optimizer": self.row_optimizer(),
               "tables": tables}
        spec = parse_model_spec(doc)
        compute_tier = self.topology.cache_tier()
        spec = dataclasses.replace(spec, tables=tuple(
            constrained_table(as_virtual(t) if t.name in virtual else t, self.constraints.get(t.name), compute_tier,
                              t.name in self.locality)
            for t in spec.tables))
        dense = dense_spec_of(module, skip=[c.module for c in embedding_modules(module)])  # its cost from its shapes
        return dataclasses.replace(spec, target_qps=self.target_qps, dense=dense,  # None: no target, place for speed
                                   input_s_per_sample=self.input_s_per_sample)

    def row_optimizer(self) -> str:
        """The optimizer rows are sized for: the one given, else the one the last ``plan``'s
        sharders train with, else "rowwise_adagrad"."""
        return self.optimizer or self._trained_optimizer or _DEFAULT_OPTIMIZER

    def _check_optimizer(self, module: nn.Module, fused_params: Optional[Mapping[str, Any]]) -> None:
        """Takes the optimizer the tables will train with (their own, else the sharder's
        ``fused_params``'); ValueError if the planner's differs from it."""
        own = [_table_optimizer(m.tables[c.name].weight) for m in embedding_modules(module) for c in m.configs]
        trained = trained_optimizer(fused_params, own)
        if self.optimizer is not None and trained is not None and canonical_optimizer(self.optimizer) != trained:
            raise ValueError(f"optimizer={self.optimizer!r} sizes the rows, but the tables will train with "
                             f"{trained!r} (the sharder's fused_params or apply_optimizer_in_backward): "
                             "give the planner the same optimizer, or none")
        self._trained_optimizer = trained

    def place(self, module: nn.Module, budget_bytes: Optional[Mapping[Tier, float]] = None) -> Placement:
        """Places the module's tables (within ``budget_bytes``, default the planner's)."""
        model = self.model_spec(module)
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        placement = place(model, self.topology, self.world_size, self.tiers, self.target_qps, budget,
                          self.cache_algorithm)
        self.last_model, self.last_placement = model, placement
        return placement

    def _search(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]):
        """TorchRec's planning loop over our components: enumerate the options of a
        placement, propose, partition until a proposal fits. Placement is over the job's
        pooled capacity, and caches sized for all of it can leave a table no rank has room
        for whole, which only a split packs; so the search is run again with caches sized
        for less of the compute tier (``COMPUTE_TIER_SHARES``), and the result whose slowest
        rank is predicted fastest wins (the larger share on a tie). Returns (placement,
        partitioned options, topology, per-rank predicted step seconds, the caches grown
        into their ranks' leftover bytes)."""
        compute_tier = self.topology.cache_tier()
        pooled = self.budget_bytes.get(compute_tier, self.topology.tiers[compute_tier].capacity_bytes * self.world_size)
        error: Optional[Exception] = None
        best = None
        for share in COMPUTE_TIER_SHARES:
            try:
                placement = self.place(module, {**self.budget_bytes, compute_tier: pooled * share})
                found = self._search_placement(module, sharders, placement, compute_tier, pooled / self.world_size)
            except PlacementError as e:
                error = error or e
                continue
            if best is None or max(found[3]) < max(best[3]):
                best = found
        if best is None:
            raise error
        self.last_placement = best[0]  # place() left the last share's
        return best

    def _search_placement(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]], placement: Placement,
                          compute_tier: Tier, rank_capacity: float):
        """The proposals of one placement: (placement, options, topology, rank steps) of the
        best that partitions, each rank's caches then grown into what it has left of its
        ``rank_capacity`` bytes of the compute tier; PlacementError when none partitions."""
        dense = dense_step_seconds(self.last_model, self.topology, self.world_size)
        topology = torchrec_topology(self.topology, self.world_size, placement.capacity_bytes)
        estimators = [TieredStorageEstimator(topology), TieredPerfEstimator(topology)]
        enumerator = TieredEnumerator(topology, self.batch_size, self.constraints, estimators, model=self.last_model,
                                      placement=placement, compute_tier=compute_tier)
        proposer = TieredProposer()
        partitioner = TieredPartitioner(dense, compute_tier, kernel_step_seconds(self.topology, True),
                                        self.topology.compute.row_wise_group_s, self.topology.compute.row_wise_setup_s)
        proposer.load(enumerator.enumerate(module, sharders), enumerator)
        last: Optional[PlannerError] = None  # the last proposal's (row-wise tried) is the telling one
        while (proposal := proposer.propose()) is not None:
            try:
                options = partitioner.partition(proposal, topology)
            except PlannerError as e:
                last = e
                proposer.feedback(partitionable=False, plan=proposal, storage_constraint=topology)
                continue
            # Rated by the slowest rank's predicted step: the job runs at its pace.
            proposer.feedback(partitionable=True, plan=options, perf_rating=max(partitioner.rank_step_s),
                              storage_constraint=topology)
        best = proposer.best()
        if best is None:
            raise PlacementError(f"{len(self.last_model.tables)} tables on {self.world_size} ranks of "
                                 f"{self.topology.name}: {last}")
        options = partitioner.partition(best, topology)  # again: later proposals moved the shards
        grown = grow_rank_caches(
            options, [rank_capacity] * self.world_size, compute_tier, self.topology, self.last_model.batch_size,
            self.cache_algorithm)
        if grown:
            enumerator.populate_estimates(options)  # the grown shards' storage and perf, from their bytes and cost
            partitioner.rate(options, self.world_size)
            extra = sum(g.extra_bytes for g in grown)
            placement = dataclasses.replace(
                placement, tables={**placement.tables, **{o.name: o.placement for o in options}},
                costs={**placement.costs, **{o.name: o.cost for o in options}},
                used_bytes={**placement.used_bytes,
                            compute_tier: placement.used_bytes.get(compute_tier, 0.0) + extra})
        return placement, options, topology, list(partitioner.rank_step_s), grown

    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        from torchrec_mtrains.sharding import (
            TieredEmbeddingBagCollectionSharder,
            TieredEmbeddingCollectionSharder,
            TieredParameterSharding,
            TieredParams,
        )
        from torchrec_mtrains.sharding.key_value import CACHE_ALGORITHMS

        if self.topology.compute_device != "cpu":
            raise ValueError(
                f"plans for DistributedModelParallel need a CPU profile in this build (the tiered kernel "
                f"runs on the CPU); {self.topology.name} is {self.topology.compute_device}: use "
                "`mtrains plan` to size such a cluster"
            )
        tiered_types = (TieredEmbeddingBagCollectionSharder, TieredEmbeddingCollectionSharder)
        if not any(isinstance(s, TieredEmbeddingBagCollectionSharder) for s in sharders):
            sharders = [TieredEmbeddingBagCollectionSharder()] + list(sharders)
        if (any(m.sequence for m in embedding_modules(module))
                and not any(isinstance(s, TieredEmbeddingCollectionSharder) for s in sharders)):
            sharders = list(sharders) + [TieredEmbeddingCollectionSharder()]
        tiered_sharders = [s for s in sharders if isinstance(s, tiered_types)]
        self._check_optimizer(module, tiered_sharders[-1].fused_params)
        placement, options, topology, rank_steps, self.last_grown_caches = self._search(module, sharders)
        self.last_rank_step_s = rank_steps
        if rank_steps and max(rank_steps) > 0:  # the job runs at its slowest rank's pace
            step = max(rank_steps)
            self.last_placement = placement = dataclasses.replace(
                placement, predicted_step_s=step, predicted_qps=self.last_model.batch_size / step)
        self.last_assignment = {
            o.name: RankAssignment(o.sharding_type, tuple(int(s.rank) for s in o.shards)) for o in options
        }
        plan = to_sharding_plan(options, topology)
        # The planner's policy as FBGEMM's CacheAlgorithm, for key_value tables naming none
        # (None for "tinylfu", which FBGEMM has no word for: such tables run LRU).
        algorithm = {name: algo for algo, name in CACHE_ALGORITHMS.items()}.get(self.cache_algorithm)
        self.last_lookahead = self.lookahead if self.lookahead is not None else choose_lookahead(
            (o.placement.tier, o.placement.cache_rows, o.table.locality) for o in options if o.is_tiered)
        for option in options:
            if not option.is_tiered:
                continue
            where = option.placement
            module_plan = plan.plan[option.path]
            ps = module_plan[option.name]
            constraint = self.constraints.get(option.name)
            if is_key_value(constraint):  # TorchRec's entry: the sharder makes it tiered on each rank
                module_plan[option.name] = key_value_entry(ps, constraint, where.cache_rows, option.table.num_embeddings,
                                                           algorithm)
                continue
            cache_rows = where.cache_rows
            if option.table.virtual and cache_rows <= 0:  # a virtual table always has its row cache
                cache_rows = DEFAULT_CACHE_LOAD_FACTOR * option.table.num_embeddings
            module_plan[option.name] = TieredParameterSharding(
                **{k: getattr(ps, k) for k in ps.__dataclass_fields__},
                tiered=TieredParams(
                    where.tier, cache_rows=max(1, int(cache_rows)), cache_algorithm=self.cache_algorithm,
                    # Every tier's tables name the directory, so that they agree on it and
                    # share a kernel (a DRAM table keeps no file there).
                    storage_dir=self.storage_dir,
                    rows_written=None if option.table.virtual else option.table.rows_written,
                    virtual_rows=option.table.num_embeddings if option.table.virtual else None,
                    lookahead=self.last_lookahead,
                ),
            )
        return plan

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        pg: Optional[dist.ProcessGroup] = None,
    ) -> ShardingPlan:
        """``plan`` on rank 0, broadcast to every rank (as TorchRec's planner does)."""
        from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

        pg = pg or dist.GroupMember.WORLD
        sharders = sharders or [TieredEmbeddingBagCollectionSharder()]  # plan() adds the EC sharder as needed
        return invoke_on_rank_and_broadcast_result(pg, 0, self.plan, module, sharders)


def _table_optimizer(weight: Any) -> Optional[Any]:
    """The optimizer ``apply_optimizer_in_backward`` gave a table's weight (as TorchRec's
    sharding reads it), or None."""
    kwargs = (getattr(weight, "_optimizer_kwargs", None) or [{}])[0]
    if kwargs.get("optimizer") is not None:
        return kwargs["optimizer"]
    classes = getattr(weight, "_optimizer_classes", None) or [None]
    if classes[0] is None:
        return None
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    return optimizer_type_to_emb_opt_type(classes[0])
