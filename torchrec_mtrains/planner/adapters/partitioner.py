"""TieredPartitioner: TorchRec's ``Partitioner`` for tiered tables, balancing each rank's
predicted step.

Row-wise options are placed first (each needs room on every rank), then the others by
largest compute-tier footprint (bin packing), then heaviest load:
a table-wise one on the rank whose step grows least among those with room on every tier it
uses (its rows on its tier, its cache in the compute tier); a row-wise one shard i on rank i.
A rank's step is the perf model's: ``max(compute + dense, busiest tier)``, its compute with
the tiered kernel's fixed cost once if it holds any tiered table, and every rank's dense
part with the collectives of each row-wise table the proposal has. Options that fit
nowhere keep shards without a rank (the proposer's cue to propose them row-wise) and the
partition raises ``PlannerError``.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from torchrec.distributed.planner.types import (
    Partitioner,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import ShardingType

from torchrec_mtrains.planner.adapters.enumerator import TieredShardingOption
from torchrec_mtrains.planner.adapters.tiered_storage import TieredStorage
from torchrec_mtrains.planner.model.estimator import step_seconds
from torchrec_mtrains.types import Tier

__all__ = ["TieredPartitioner"]


@dataclasses.dataclass
class _Rank:
    free: TieredStorage
    compute: float = 0.0
    io: Dict[Tier, float] = dataclasses.field(default_factory=dict)
    kernel: float = 0.0  # the tiered kernel's fixed cost, once it holds a tiered table

    def with_work(self, option: TieredShardingOption, fraction: float) -> Tuple[float, Dict[Tier, float]]:
        """(compute, io per tier) of this rank plus ``fraction`` of the option's table."""
        io = dict(self.io)
        for t, s in option.cost.io_s.items():
            io[t] = io.get(t, 0.0) + s * fraction
        return self.compute + option.cost.compute_s * fraction, io

    def step(self, dense: float, option: Optional[TieredShardingOption] = None, kernel_s: float = 0.0) -> float:
        compute, io = (self.compute, self.io) if option is None else self.with_work(option, 1.0)
        kernel = max(self.kernel, kernel_s if option is not None and option.is_tiered else 0.0)
        return step_seconds(compute + kernel, io, dense)

    def take(self, option: TieredShardingOption, shard_index: int, kernel_s: float) -> None:
        shard = option.shards[shard_index]
        self.free = self.free - shard.storage
        self.compute, self.io = self.with_work(option, option.shard_fraction(shard))
        if option.is_tiered:
            self.kernel = kernel_s


class TieredPartitioner(Partitioner):
    """Args: ``dense_s_per_rank``: the dense part of a rank's step (it is the same on every
    rank, but sets how much embedding work a rank takes before its step grows);
    ``compute_tier``: where caches and whole tables live (HBM or DRAM); ``kernel_s``: the
    tiered kernel's fixed cost per step, paid once by a rank with any tiered table;
    ``row_wise_group_s``: what a row-wise table's collectives cost every rank per step (its
    ids' all-to-all and its pooled embeddings' reduce-scatter), paid per row-wise table;
    ``row_wise_setup_s``: what the row-wise sharding group costs every rank per step once
    it holds any table."""

    def __init__(self, dense_s_per_rank: float, compute_tier: Tier, kernel_s: float = 0.0,
                 row_wise_group_s: float = 0.0, row_wise_setup_s: float = 0.0) -> None:
        self._dense_alone = dense_s_per_rank
        self._dense = dense_s_per_rank
        self._compute_tier = compute_tier
        self._kernel = kernel_s
        self._row_wise_group = row_wise_group_s
        self._row_wise_setup = row_wise_setup_s
        self.rank_step_s: List[float] = []  # of the last successful partition

    def partition(self, proposal: List[ShardingOption], storage_constraint: Topology) -> List[ShardingOption]:
        options: List[TieredShardingOption] = [o for o in proposal if isinstance(o, TieredShardingOption)]
        if len(options) != len(proposal):
            raise PlannerError("TieredPartitioner partitions the TieredShardingOptions of TieredEnumerator",
                               PlannerErrorType.PARTITION)
        ranks = [_Rank(free=TieredStorage.of_storage(d.storage)) for d in storage_constraint.devices]
        row_wise = sum(o.sharding_type == ShardingType.ROW_WISE.value for o in options)
        collectives = self._row_wise_setup + self._row_wise_group * row_wise if row_wise and len(ranks) > 1 else 0.0
        self._dense = self._dense_alone + collectives
        for option in options:
            for shard in option.shards:
                shard.rank = None

        def load(o: TieredShardingOption) -> float:
            return max([o.cost.compute_s] + list(o.cost.io_s.values()))

        def order(o: TieredShardingOption) -> Tuple[bool, float, float]:
            # Row-wise options first: each needs room on every rank, which table-wise ones
            # placed before them would have taken from some.
            return (o.sharding_type == ShardingType.ROW_WISE.value, o.tier_bytes.get(self._compute_tier, 0.0), load(o))

        unplaced: List[str] = []
        for option in sorted(options, key=order, reverse=True):
            if option.sharding_type == ShardingType.TABLE_WISE.value:
                shard = option.shards[0]
                fits = [r for r, rank in enumerate(ranks) if shard.storage.fits_in(rank.free)]
                if not fits:
                    unplaced.append(f"{option.name} (whole on one rank)")
                    continue
                best = min(fits, key=lambda r: (ranks[r].step(self._dense, option, self._kernel), r))
                ranks[best].take(option, 0, self._kernel)
                shard.rank = best
            else:  # row-wise: shard i on rank i
                if len(option.shards) != len(ranks) or not all(
                        s.storage.fits_in(rank.free) for s, rank in zip(option.shards, ranks)):
                    unplaced.append(f"{option.name} (even split by rows)")
                    continue
                for r, shard in enumerate(option.shards):
                    ranks[r].take(option, r, self._kernel)
                    shard.rank = r
        if unplaced:
            names = ", ".join(unplaced[:5]) + (f" and {len(unplaced) - 5} more" if len(unplaced) > 5 else "")
            raise PlannerError(f"tables {names} do not fit the capacity of {len(ranks)} ranks",
                               PlannerErrorType.PARTITION)
        self.rank_step_s = [rank.step(self._dense) for rank in ranks]
        return proposal

    def rate(self, options: List[TieredShardingOption], world_size: int) -> List[float]:
        """Each rank's predicted step for ``options`` as the last ``partition`` placed them
        (their shards' ranks), after their costs changed (``grow_rank_caches``); also
        ``rank_step_s``."""
        ranks = [_Rank(free=TieredStorage.of({})) for _ in range(world_size)]
        for option in options:
            for i, shard in enumerate(option.shards):
                ranks[shard.rank].take(option, i, self._kernel)
        self.rank_step_s = [rank.step(self._dense) for rank in ranks]
        return self.rank_step_s

