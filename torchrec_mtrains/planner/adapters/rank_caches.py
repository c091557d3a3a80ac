"""Each rank's caches, sized after the shardings are chosen.

The placement sizes every cache for the job's compute tier as a whole, as if the work
spread evenly; the partitioner then packs whole tables onto ranks, and a table's cache
fits on one rank or another, not partly on each, so each rank keeps some of its own share
unused. ``grow_rank_caches`` spends what each rank has left on the caches of the
table-wise SSD tables that rank holds: repeatedly the growth that saves the most
predicted seconds a step (the perf model's compute and device time) per extra byte, by a
quarter of the cache at a time or what still fits, while the rank has room and a larger
cache saves time. A row-wise table keeps its size (one size for all its shards), and so
do a table whose cache size a constraint pins, a virtual table and a table with a GPU
node's host-DRAM L2 cache.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, NamedTuple, Optional, Sequence

from torchrec.distributed.types import ShardingType

from torchrec_mtrains.planner.adapters.enumerator import TieredShardingOption
from torchrec_mtrains.planner.adapters.tiered_storage import TieredStorage
from torchrec_mtrains.planner.model.estimator import TableCost, table_cost
from torchrec_mtrains.planner.model.placement import tier_bytes
from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["GROWN_TIERS", "GROWTH", "GrownCache", "grow_rank_caches"]

GROWTH = 0.25  # a step grows a cache by this share of its rows (or by what still fits)
# Only SSD tables' caches grow: there a miss is a device read (some 3-5 us of the rank's CPU).
# A larger cache also costs every step something the perf model does not price: grown SCM
# caches (a miss a memory copy, 0.4 us) made the example DLRM at a third of its DRAM 0.89x as
# fast (docs/results/planner.md).
GROWN_TIERS = frozenset({Tier.SSD})


@dataclasses.dataclass
class _Growth:
    """A candidate growth of one option's cache: its new rows, cost and bytes per tier."""

    option: TieredShardingOption
    rows: int
    cost: TableCost
    bytes: Dict[Tier, float]
    extra: float  # compute-tier bytes it adds
    saved: float  # predicted seconds a step it saves


def _growable(option: TieredShardingOption) -> bool:
    where, table = option.placement, option.table
    return (option.is_tiered and option.sharding_type == ShardingType.TABLE_WISE.value and where.tier in GROWN_TIERS
            and where.cache_rows > 0
            and not table.virtual and table.pinned_cache_rows is None and not where.extra.get("l2_cache_rows")
            and where.cache_rows < table.num_embeddings)


def _seconds(cost: TableCost) -> float:
    return cost.compute_s + sum(cost.io_s.values())


def _next(option: TieredShardingOption, free: float, compute_tier: Tier, topo: TieredTopology, batch_size: int,
          policy: str) -> Optional[_Growth]:
    """The option's next growth within ``free`` compute-tier bytes, or None (no room, no gain)."""
    table, where = option.table, option.placement
    now = option.tier_bytes.get(compute_tier, 0.0)
    # The kernel holds at least two steps' distinct rows whatever its size (table_cost): grow
    # from there, or a small cache's first growth would change nothing.
    held = max(float(where.cache_rows), 2.0 * table.locality.unique_rows_per_step)
    rows = min(table.num_embeddings, math.ceil(held * (1.0 + GROWTH)))
    while rows > where.cache_rows:  # at most a few rounds: the bytes are near linear in the rows
        grown = tier_bytes(table, where.tier, rows, 0.0, compute_tier)
        extra = grown.get(compute_tier, 0.0) - now
        if extra <= free:
            break
        rows = where.cache_rows + math.floor((rows - where.cache_rows) * max(0.0, free) / extra)
    if rows <= where.cache_rows:
        return None
    cost = table_cost(table, where.tier, rows, topo, batch_size, policy)
    saved = _seconds(option.cost) - _seconds(cost)
    return _Growth(option, rows, cost, grown, extra, saved) if saved > 0 else None


class GrownCache(NamedTuple):
    """A cache ``grow_rank_caches`` grew: its table, rows before and after, and the bytes of
    the compute tier it added."""

    table: str
    rows_before: int
    rows_after: int
    extra_bytes: float


def grow_rank_caches(options: Sequence[TieredShardingOption], rank_capacity: Sequence[float], compute_tier: Tier,
                     topo: TieredTopology, batch_size: int, policy: str) -> List[GrownCache]:
    """Grows the caches of the partitioned ``options`` (each shard with its rank) into what
    each rank has left of ``rank_capacity`` bytes of the compute tier; updates the grown
    options' placement, cost and bytes per tier in place; their shards' storage and perf
    follow from those (the enumerator's estimators, run again by the caller)."""
    used = [0.0] * len(rank_capacity)
    for option in options:
        for shard in option.shards:
            if shard.rank is not None:
                used[shard.rank] += TieredStorage.of_storage(shard.storage).on(compute_tier)
    before = {o.name: (o.placement.cache_rows, o.tier_bytes.get(compute_tier, 0.0)) for o in options if _growable(o)}
    while True:
        best: Optional[_Growth] = None
        for option in options:
            if not _growable(option):
                continue
            rank = option.shards[0].rank
            growth = _next(option, rank_capacity[rank] - used[rank], compute_tier, topo, batch_size, policy)
            if growth is not None and (best is None or growth.saved / growth.extra > best.saved / best.extra):
                best = growth
        if best is None:
            break
        option, old = best.option, best.option.cost
        scale = best.cost.tier_bytes_per_step / old.tier_bytes_per_step if old.tier_bytes_per_step else 0.0
        option.placement = dataclasses.replace(option.placement, cache_rows=best.rows,
                                               hit_rate=best.cost.hit_rate,
                                               bandwidth_bytes_per_s=option.placement.bandwidth_bytes_per_s * scale)
        option.cost, option.tier_bytes = best.cost, best.bytes
        used[option.shards[0].rank] += best.extra
    return [GrownCache(o.name, before[o.name][0], o.placement.cache_rows,
                       o.tier_bytes.get(compute_tier, 0.0) - before[o.name][1])
            for o in options if o.name in before and o.placement.cache_rows != before[o.name][0]]
