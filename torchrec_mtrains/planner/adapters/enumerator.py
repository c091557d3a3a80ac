"""TieredEnumerator: TorchRec's ``Enumerator`` over a placement.

The placement (placement.py) chooses each table's tier and cache size for the whole job at
once: a knapsack over the compute tier's bytes that per-table options cannot express. The
enumerator turns it into TorchRec's search space: per table, a ``TieredShardingOption``
for each sharding type the sharder offers among table-wise and row-wise, with our kernel
(CUSTOMIZED_KERNEL) for tiered tables and FBGEMM's (FUSED) for tables whole in the compute
tier, its shards laid out by TorchRec, and their storage and perf filled in by the
estimators (shard_estimators.py).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Union

from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PartitionByType,
    PlannerError,
    PlannerErrorType,
    Shard,
    ShardEstimator,
    ShardingOption,
    Topology,
)
from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets
from torchrec.distributed.types import ModuleSharder, ShardingType

from torchrec_mtrains.planner.embedding_modules import embedding_modules
from torchrec_mtrains.planner.model.estimator import TableCost
from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.model.placement import Placement, tier_bytes
from torchrec_mtrains.planner.types import TablePlacement
from torchrec_mtrains.types import Tier

__all__ = ["TieredEnumerator", "TieredShardingOption", "SHARDING_TYPES"]

SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value)
_PARTITION_BY = {ShardingType.TABLE_WISE.value: PartitionByType.DEVICE.value,
                 ShardingType.ROW_WISE.value: PartitionByType.UNIFORM.value}


class TieredShardingOption(ShardingOption):
    """A ``ShardingOption`` that carries the placement's choice for its table.

    Extra attributes: ``table`` (the planner's ModelTable), ``placement`` (tier, cache rows,
    predicted hit rate), ``cost`` (the perf model's TableCost of the whole table) and
    ``tier_bytes`` (the whole table's bytes per tier: its rows on its tier, its cache in
    the compute tier)."""

    def __init__(self, *args, table: ModelTable, placement: TablePlacement, cost: TableCost,
                 tier_bytes: Dict[Tier, float], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.table = table
        self.placement = placement
        self.cost = cost
        self.tier_bytes = tier_bytes

    @property
    def is_tiered(self) -> bool:
        return self.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value

    def shard_fraction(self, shard: Shard) -> float:
        """The share of the table's rows (and so of its bytes and work) in ``shard``: of
        its ids, for a virtual table (whose ids spread evenly over its buckets)."""
        return shard.size[0] / self.tensor.shape[0]


class TieredEnumerator(Enumerator):
    """Sharding options of every EmbeddingBagCollection or EmbeddingCollection table for a
    given placement.

    Args (beyond TorchRec's): ``model`` and ``placement``, the planner's view of the tables
    and where placement.py put them; ``compute_tier``: the tier kernels compute in (HBM on a
    GPU node, DRAM on a CPU node). Of TorchRec's ``constraints`` only ``sharding_types`` act
    here (they limit a table's options); the rest reach the model and the placement."""

    def __init__(
        self,
        topology: Topology,
        batch_size: int = BATCH_SIZE,
        constraints: Optional[Dict[str, ParameterConstraints]] = None,
        estimator: Optional[Union[ShardEstimator, List[ShardEstimator]]] = None,
        *,
        model: ModelSpec,
        placement: Placement,
        compute_tier: Tier,
    ) -> None:
        self._topology = topology
        self._batch_size = batch_size
        self._constraints = dict(constraints or {})
        self._estimators = [] if estimator is None else (estimator if isinstance(estimator, list) else [estimator])
        self._tables = {t.name: t for t in model.tables}
        self._placement = placement
        self._compute_tier = compute_tier

    def enumerate(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
        by_type = {sharder.module_type: sharder for sharder in sharders}
        device = self._topology.compute_device
        options: List[ShardingOption] = []
        for collection in embedding_modules(module):
            path, ebc = collection.path, collection.module
            sharder = by_type.get(type(ebc))
            if sharder is None:
                raise PlannerError(f"no sharder for {type(ebc).__name__} at {path!r}", PlannerErrorType.OTHER)
            for config in collection.configs:
                where = self._placement.tables[config.name]
                table = self._tables[config.name]
                # A virtual table runs on the tiered kernel whatever its tier: FBGEMM's have no ids.
                tiered = where.tier != self._compute_tier or where.cache_rows > 0 or table.virtual
                kernel = (EmbeddingComputeKernel.CUSTOMIZED_KERNEL if tiered else EmbeddingComputeKernel.FUSED).value
                tensor = collection.tables[config.name].weight
                whole = tier_bytes(table, where.tier, where.cache_rows, where.extra.get("l2_cache_rows", 0.0),
                                   self._compute_tier)
                allowed = getattr(self._constraints.get(config.name), "sharding_types", None) or SHARDING_TYPES
                if table.virtual:  # row-wise by its buckets, as TorchRec shards a virtual table
                    allowed = [s for s in allowed if s == ShardingType.ROW_WISE.value]
                offered = [s for s in SHARDING_TYPES if s in sharder.sharding_types(device) and s in allowed
                           and kernel in sharder.compute_kernels(s, device)]
                if not offered:
                    raise PlannerError(f"the sharder of {path!r} offers neither table-wise nor row-wise sharding "
                                       f"with kernel {kernel} for table {config.name}", PlannerErrorType.OTHER)
                for sharding_type in offered:
                    sizes, offsets = calculate_shard_sizes_and_offsets(
                        tensor, self._topology.world_size, self._topology.local_world_size, sharding_type,
                        num_buckets=config.total_num_buckets if table.virtual else None)
                    options.append(TieredShardingOption(
                        name=config.name, tensor=tensor, module=(path, ebc),
                        input_lengths=[table.pooling_factor] * len(config.feature_names),
                        batch_size=self._batch_size, sharding_type=sharding_type,
                        partition_by=_PARTITION_BY[sharding_type], compute_kernel=kernel,
                        shards=[Shard(size=s, offset=o) for s, o in zip(sizes, offsets)],
                        feature_names=list(config.feature_names),
                        table=table, placement=where, cost=self._placement.costs[config.name], tier_bytes=whole,
                    ))
        self.populate_estimates(options)
        return options

    def populate_estimates(self, sharding_options: List[ShardingOption]) -> None:
        for estimator in self._estimators:
            estimator.estimate(sharding_options, None)
