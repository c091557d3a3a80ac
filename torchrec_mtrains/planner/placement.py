"""Placement: each table's tier and cache size for a given number of ranks.

1. Hottest tables first (traffic per byte), whole tables go into the compute tier (HBM on a
   GPU node, DRAM on a CPU node) while it has room beyond a reserve for the caches of the
   rest.
2. The rest, coldest first, go to the cheapest tier that holds them (SSD, then SCM, then
   DRAM on a GPU node) with the smallest cache whose miss traffic fits what is left of
   that tier's device time in a step at the target QPS (all ranks together).
3. A table no tier can feed goes whole into the compute tier if it still fits; otherwise
   the placement is infeasible, with a message naming the tables and the shortfall.
Per-rank balance is the partitioner's job; the prediction here assumes an even spread.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from torchrec_mtrains.planner.estimator import TableCost, step_seconds, table_cost
from torchrec_mtrains.planner.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.types import TablePlacement, TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["Placement", "PlacementError", "place", "CACHE_FRACTIONS"]

CACHE_FRACTIONS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
_CACHE_RESERVE = 0.01  # of each not-yet-placed table's bytes, kept free in the compute tier
_BACKING_ORDER = (Tier.SSD, Tier.SCM, Tier.DRAM)  # cheapest first


class PlacementError(ValueError):
    """The model does not fit the hardware at this size."""


@dataclasses.dataclass(frozen=True)
class Placement:
    world_size: int
    tables: Dict[str, TablePlacement]
    costs: Dict[str, TableCost]
    used_bytes: Dict[Tier, float]  # whole job, caches counted in the compute tier
    capacity_bytes: Dict[Tier, float]
    predicted_step_s: float
    predicted_qps: float


def _caps(topo: TieredTopology, world_size: int, tiers: Sequence[Tier], budget: Mapping[Tier, float]) -> Dict[Tier, float]:
    caps = {}
    for tier in tiers:
        if tier in topo.tiers:
            caps[tier] = budget.get(tier, topo.tiers[tier].capacity_bytes * world_size)
    return caps


def _cache_bytes(table: ModelTable, rows: float) -> float:
    return rows * table.row_bytes


def place(
    model: ModelSpec,
    topo: TieredTopology,
    world_size: int,
    tiers: Optional[Sequence[Tier]] = None,
    target_qps: Optional[float] = None,
    budget_bytes: Optional[Mapping[Tier, float]] = None,
    policy: str = "lru",
) -> Placement:
    """Places ``model`` on ``world_size`` ranks of ``topo`` using ``tiers`` (default: all
    the node has); ``budget_bytes`` caps a tier's bytes for the whole job (e.g. the DRAM
    embeddings may use). Raises PlacementError if it does not fit."""
    fast = topo.cache_tier()
    tiers = list(tiers) if tiers is not None else list(topo.tiers)
    if fast not in tiers or fast not in topo.tiers:
        raise PlacementError(f"the {topo.name} profile has no {fast.name} tier to compute in")
    caps = _caps(topo, world_size, tiers, budget_bytes or {})
    used = {t: 0.0 for t in caps}
    qps = target_qps or model.target_qps
    step_budget = model.batch_size / qps if qps else None
    io_left = {t: (step_budget * world_size if step_budget else float("inf")) for t in caps}
    io_left[Tier.HBM] = io_left.get(Tier.HBM, step_budget * world_size if step_budget else float("inf"))
    backing = [t for t in _BACKING_ORDER if t in caps and t != fast]

    def density(t: ModelTable) -> float:
        return t.locality.unique_rows_per_step * t.row_bytes / t.bytes

    order = sorted(model.tables, key=density, reverse=True)
    placed: Dict[str, Tuple[Tier, float]] = {}
    reserve = sum(t.bytes for t in order) * _CACHE_RESERVE
    rest: List[ModelTable] = []
    for table in order:  # 1. hottest whole tables into the compute tier
        reserve -= table.bytes * _CACHE_RESERVE
        if used[fast] + table.bytes + reserve <= caps[fast]:
            placed[table.name] = (fast, 0.0)
            used[fast] += table.bytes
        else:
            rest.append(table)
    homeless: List[ModelTable] = []
    for table in reversed(rest):  # 2. coldest first onto the cheapest tier that feeds it
        choice = None
        for tier in backing:
            if used[tier] + table.bytes > caps[tier]:
                continue
            for frac in CACHE_FRACTIONS:
                rows = max(1.0, frac * table.num_embeddings)
                if used[fast] + _cache_bytes(table, rows) > caps[fast]:
                    break
                cost = table_cost(table, tier, rows, topo, model.batch_size, policy)
                if all(cost.io_s[t] <= io_left.get(t, float("inf")) for t in cost.io_s):
                    choice = (tier, rows, cost)
                    break
            if choice:
                break
        if choice is None:
            homeless.append(table)
            continue
        tier, rows, cost = choice
        placed[table.name] = (tier, rows)
        used[tier] += table.bytes
        used[fast] += _cache_bytes(table, rows)
        for t, s in cost.io_s.items():
            io_left[t] = io_left.get(t, float("inf")) - s
    short = []
    for table in homeless:  # 3. whole into the compute tier, if it still fits
        if used[fast] + table.bytes <= caps[fast]:
            placed[table.name] = (fast, 0.0)
            used[fast] += table.bytes
        else:
            short.append(table)
    if short:
        need = sum(t.bytes for t in short)
        names = ", ".join(t.name for t in short[:5]) + (f" and {len(short) - 5} more" if len(short) > 5 else "")
        raise PlacementError(
            f"{len(short)} tables ({names}; {need / 2**30:,.1f} GiB) fit no tier of {world_size} ranks of "
            f"{topo.name}: capacity left {', '.join(f'{t.name} {(caps[t] - used[t]) / 2**30:,.1f} GiB' for t in caps)}"
            + (f", and no tier's bandwidth can feed them at {qps:,.0f} QPS" if qps else "")
        )
    return _finish(model, topo, world_size, placed, used, caps, policy)


def _finish(model, topo, world_size, placed, used, caps, policy) -> Placement:
    tables, costs = {}, {}
    compute, io = 0.0, {}
    qps = model.target_qps
    for table in model.tables:
        tier, rows = placed[table.name]
        cost = table_cost(table, tier, rows, topo, model.batch_size, policy)
        costs[table.name] = cost
        compute += cost.compute_s
        for t, s in cost.io_s.items():
            io[t] = io.get(t, 0.0) + s
        tables[table.name] = TablePlacement(
            table.name, tier, int(round(rows)), cost.hit_rate,
            cost.tier_bytes_per_step * (qps / model.batch_size if qps else 0.0),
        )
    dense = topo.compute.dense_s_per_sample * model.batch_size
    step = step_seconds(compute / world_size, {t: s / world_size for t, s in io.items()}, dense / world_size)
    return Placement(world_size, tables, costs, used, caps, step, model.batch_size / step if step > 0 else float("inf"))
