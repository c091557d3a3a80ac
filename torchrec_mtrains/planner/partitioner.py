"""Partitioner: spreads placed tables over ranks, balancing each rank's predicted step.

Tables go whole to one rank (table-wise), the largest compute-tier footprint first, onto the
rank whose step grows least, within each rank's capacity on the table's tier (and on the
compute tier for its cache). A table larger than any rank's room is split by rows over all ranks (row-wise).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from torchrec_mtrains.planner.estimator import step_seconds
from torchrec_mtrains.planner.model_spec import ModelSpec
from torchrec_mtrains.planner.placement import Placement, PlacementError
from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["RankAssignment", "partition"]


@dataclasses.dataclass(frozen=True)
class RankAssignment:
    sharding_type: str  # "table_wise" or "row_wise"
    ranks: Tuple[int, ...]


@dataclasses.dataclass
class _Rank:
    compute: float = 0.0
    io: Dict[Tier, float] = dataclasses.field(default_factory=dict)
    used: Dict[Tier, float] = dataclasses.field(default_factory=dict)

    def step(self, dense: float, extra_compute: float = 0.0, extra_io: Dict[Tier, float] = None) -> float:
        io = dict(self.io)
        for t, s in (extra_io or {}).items():
            io[t] = io.get(t, 0.0) + s
        return step_seconds(self.compute + extra_compute, io, dense)


def partition(model: ModelSpec, placement: Placement, topo: TieredTopology) -> Tuple[Dict[str, RankAssignment], List[float]]:
    """(assignment per table, predicted step seconds per rank)."""
    world = placement.world_size
    ranks = [_Rank() for _ in range(world)]
    cap = {t: placement.capacity_bytes[t] / world for t in placement.capacity_bytes}
    fast = topo.cache_tier()
    dense = topo.compute.dense_s_per_sample * model.batch_size / world
    by_name = {t.name: t for t in model.tables}

    def load(name: str) -> float:
        c = placement.costs[name]
        return max([c.compute_s] + list(c.io_s.values()))

    def fast_bytes(name: str) -> float:
        where, table = placement.tables[name], by_name[name]
        return where.cache_rows * table.row_bytes if where.cache_rows else (table.bytes if where.tier == fast else 0.0)

    out: Dict[str, RankAssignment] = {}
    # Largest compute-tier footprint first (bin packing), then the heaviest load.
    for name in sorted(by_name, key=lambda n: (fast_bytes(n), load(n)), reverse=True):
        table, where, cost = by_name[name], placement.tables[name], placement.costs[name]
        need = {where.tier: table.bytes}
        if where.cache_rows:
            need[fast] = need.get(fast, 0.0) + where.cache_rows * table.row_bytes
        fits = [r for r, rank in enumerate(ranks)
                if all(rank.used.get(t, 0.0) + b <= cap[t] for t, b in need.items())]
        if fits:
            best = min(fits, key=lambda r: (ranks[r].step(dense, cost.compute_s, cost.io_s), r))
            chosen = [best]
            out[name] = RankAssignment("table_wise", (best,))
        else:
            share = {t: b / world for t, b in need.items()}
            if any(rank.used.get(t, 0.0) + b > cap[t] for rank in ranks for t, b in share.items()):
                raise PlacementError(f"table {name} does not fit even split by rows over {world} ranks")
            chosen = list(range(world))
            out[name] = RankAssignment("row_wise", tuple(chosen))
        part = 1.0 / len(chosen)
        for r in chosen:
            ranks[r].compute += cost.compute_s * part
            for t, s in cost.io_s.items():
                ranks[r].io[t] = ranks[r].io.get(t, 0.0) + s * part
            for t, b in need.items():
                ranks[r].used[t] = ranks[r].used.get(t, 0.0) + b * part
    return out, [rank.step(dense) for rank in ranks]
