"""Placement: each table's tier and cache size for a given number of ranks.

1. Every table starts on the cheapest tier that holds it (SSD, then SCM, then DRAM on a
   GPU node, then the compute tier) with the smallest cache the kernel can run with (two
   steps' distinct rows: a step in flight and the one being prefetched); a table whose
   smallest cache would be half of it, or of at most 4 MiB, stays whole in the compute tier.
2. While a tier's device time per step exceeds its budget (half the step time at the
   target QPS, all ranks together; without a target, half the compute time), the best action on a
   table of that tier is taken: moving it to a faster backing tier that has room and
   bandwidth (free), growing its cache to the next size, or making it whole in the compute
   tier -- whichever removes the most device time per byte of the compute tier (HBM on a
   GPU node, DRAM on a CPU node). A heap keeps this O(actions log actions).
   If the compute tier fills up first, the placement is infeasible at this size (with a
   target), or the best the capacity allows (without one).
3. What the compute tier has left is then spent the same way on any remaining device time
   (a budget that holds every table keeps every table whole in it).
On a CPU node a tiered table is made whole in DRAM only if it fits one rank's share, so that
it can stay table-wise: a table split by rows adds a sharding group whose collectives (gloo,
on the same cores) cost more than a cache's misses (the example DLRM at a third of its DRAM:
+16-29% QPS with the larger Zipf table cached on SCM instead of whole in DRAM row-wise).
On a GPU node a SCM/SSD table may also get a host-DRAM cache under its HBM one (MTrainS's
hierarchical cache): growing it is one more action, its DRAM bytes weighed against HBM bytes
by how much more DRAM there is; moving a whole table into DRAM is costed the same way.
Per-rank balance is the partitioner's job; the prediction here assumes an even spread.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from torchrec_mtrains.planner.model.estimator import TableCost, step_seconds, table_cost
from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.types import TablePlacement, TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["Placement", "PlacementError", "place", "tier_bytes", "CACHE_FRACTIONS"]

CACHE_FRACTIONS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
_SMALL_TABLE_BYTES = 4 << 20
_L2_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0)
MAX_TIER_UTILIZATION = 0.5
"""Share of a step a tier's device may be busy: queues and the I/O's own CPU work (on a CPU
node it shares the cores with compute) make a device near saturation slow the step (the
kernel benchmark's SSD step ran 1.34x its device time when the device was the bound)."""
_RELAXED = (4.0, 16.0)  # looser step-2 budgets tried when the real one strands (see place)
# (start on the fastest tier, step-2 budget factor), in the order place() tries them.
_STRATEGIES = [(False, 1.0)] + [(False, r) for r in _RELAXED] + [(True, 1.0)] + [(True, r) for r in _RELAXED]
_BACKING_ORDER = (Tier.SSD, Tier.SCM, Tier.DRAM)  # cheapest first


def tier_bytes(table: ModelTable, tier: Tier, cache_rows: float, l2_rows: float, compute_tier: Tier) -> Dict[Tier, float]:
    """A table's bytes on each tier: whole in ``compute_tier`` (no cache), or its rows on
    ``tier`` with a cache of ``cache_rows`` in the compute tier and, on a GPU node, an L2
    cache of ``l2_rows`` in host DRAM."""
    if tier == compute_tier and cache_rows <= 0:
        return {compute_tier: table.bytes}
    out = {tier: table.bytes}
    out[compute_tier] = out.get(compute_tier, 0.0) + cache_rows * table.row_bytes
    if l2_rows:
        out[Tier.DRAM] = out.get(Tier.DRAM, 0.0) + l2_rows * table.row_bytes
    return out


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


def _cache_sizes(table: ModelTable) -> List[float]:
    floor = min(float(table.num_embeddings), max(1.0, 2.0 * table.locality.unique_rows_per_step))
    sizes = sorted({max(floor, min(float(table.num_embeddings), f * table.num_embeddings)) for f in CACHE_FRACTIONS})
    return sizes


def _l2_sizes(table: ModelTable) -> List[float]:
    return [f * table.num_embeddings for f in _L2_FRACTIONS]


def place(
    model: ModelSpec,
    topo: TieredTopology,
    world_size: int,
    tiers: Optional[Sequence[Tier]] = None,
    target_qps: Optional[float] = None,
    budget_bytes: Optional[Mapping[Tier, float]] = None,
    policy: str = "lru",
    max_tier_utilization: float = MAX_TIER_UTILIZATION,
) -> Placement:
    """Places ``model`` on ``world_size`` ranks of ``topo`` using ``tiers`` (default: all
    the node has); ``budget_bytes`` caps a tier's bytes for the whole job (e.g. the DRAM
    embeddings may use); a tier's device may be busy for at most ``max_tier_utilization``
    of a step. Raises PlacementError if it does not fit.

    Relieving the tiers over budget (step 2) is greedy and can strand: while every cache
    is small a faster tier is over budget too, so tables stay on a slow tier whose load
    no cache the compute tier can still afford brings down. If it fails that way, steps 2
    and 3 run again with step 2 steering by a looser budget (``_RELAXED``: tables move to
    the faster tiers first, step 3 then grows every cache), and the result is checked
    against the real budget."""
    first: Optional[PlacementError] = None
    for fastest_first, relax in _STRATEGIES:
        try:
            return _place(model, topo, world_size, tiers, target_qps, budget_bytes, policy, max_tier_utilization,
                          relax, fastest_first)
        except _BusyTiers as e:
            first = first or e
    raise first


class _BusyTiers(PlacementError):
    """Tiers stay over their device-time budget."""


def _place(
    model: ModelSpec,
    topo: TieredTopology,
    world_size: int,
    tiers: Optional[Sequence[Tier]],
    target_qps: Optional[float],
    budget_bytes: Optional[Mapping[Tier, float]],
    policy: str,
    max_tier_utilization: float,
    relax: float,
    fastest_first: bool,
) -> Placement:
    fast = topo.cache_tier()
    tiers = list(tiers) if tiers is not None else list(topo.tiers)
    if fast not in tiers or fast not in topo.tiers:
        raise PlacementError(f"the {topo.name} profile has no {fast.name} tier to compute in")
    caps = _caps(topo, world_size, tiers, budget_bytes or {})
    used = {t: 0.0 for t in caps}
    qps = target_qps or model.target_qps
    backing = [t for t in _BACKING_ORDER if t in caps and t != fast]
    compute_s = sum(table_cost(t, fast, 0.0, topo, model.batch_size).compute_s for t in model.tables)
    dense_s = topo.compute.dense_s_per_sample * model.batch_size
    step_budget = model.batch_size / qps if qps else (compute_s + dense_s) / world_size
    io_budget = step_budget * world_size * max_tier_utilization  # device seconds per step, all ranks

    sizes = {t.name: _cache_sizes(t) for t in model.tables}
    # On a GPU node a SCM/SSD table may also get a host-DRAM cache under its HBM one.
    l2_ok = topo.compute_device == "cuda" and Tier.DRAM in caps
    l2_sizes = {t.name: _l2_sizes(t) for t in model.tables} if l2_ok else {}
    # Host-DRAM bytes weigh what HBM bytes do, scaled by how much more of them there is.
    l2_weight = caps[fast] / caps[Tier.DRAM] if l2_ok and caps[Tier.DRAM] > 0 else 1.0
    # table -> (tier, cache size index or -1 = whole in fast, L2 size index or -1 = none)
    state: Dict[str, Tuple[Tier, int, int]] = {}
    io: Dict[Tier, float] = {}
    costs: Dict[Tuple[str, Tier, int, int], TableCost] = {}

    def l2_rows(table: ModelTable, k2: int) -> float:
        return 0.0 if k2 < 0 else l2_sizes[table.name][k2]

    def cost(table: ModelTable, tier: Tier, k: int, k2: int = -1) -> TableCost:
        key = (table.name, tier, k, k2)
        if key not in costs:
            costs[key] = table_cost(table, tier, 0.0 if k < 0 else sizes[table.name][k], topo, model.batch_size,
                                    policy, l2_rows(table, k2))
        return costs[key]

    def fast_bytes(table: ModelTable, k: int) -> float:
        return table.bytes if k < 0 else sizes[table.name][k] * table.row_bytes

    def apply(table: ModelTable, tier: Tier, k: int, k2: int, sign: float) -> None:
        cache_rows = 0.0 if k < 0 else sizes[table.name][k]
        for t, b in tier_bytes(table, tier, cache_rows, l2_rows(table, k2), fast).items():
            used[t] += sign * b
        for t, sec in cost(table, tier, k, k2).io_s.items():
            io[t] = io.get(t, 0.0) + sign * sec

    by_name = {t.name: t for t in model.tables}
    # Largest table the compute tier takes whole from a backing tier (see the module doc).
    whole_limit = caps[fast] / world_size if topo.compute_device == "cpu" else float("inf")
    homeless: List[str] = []  # whole in the compute tier because no other tier holds them
    if fastest_first:
        start = list(reversed(backing))

        def density(t: ModelTable) -> float:
            return sum(cost(t, backing[0], 0).io_s.values()) / t.bytes if backing and sizes[t.name] else 0.0

        first_order = sorted(model.tables, key=lambda t: (-density(t), -t.bytes))
    else:
        start, first_order = backing, sorted(model.tables, key=lambda t: -t.bytes)
    for table in first_order:  # 1. cheapest (or fastest) tier that holds it
        # Keep whole: a table whose smallest cache would hold half of it, or a small one (a
        # tiered table costs a fixed step overhead that its bytes do not repay).
        if fast_bytes(table, 0) >= 0.5 * table.bytes or table.bytes <= _SMALL_TABLE_BYTES:
            state[table.name] = (fast, -1, -1)
            apply(table, fast, -1, -1, 1.0)
            continue
        for tier in start:
            if used[tier] + table.bytes <= caps[tier] and used[fast] + fast_bytes(table, 0) <= caps[fast]:
                state[table.name] = (tier, 0, -1)
                break
        else:
            state[table.name] = (fast, -1, -1)
            homeless.append(table.name)
        apply(table, *state[table.name], 1.0)
    if used[fast] > caps[fast]:
        raise _no_room(model, topo, world_size, caps, used, qps, homeless=homeless)

    limit = [io_budget * relax]  # phase 2: the (steering) budget; phase 3: any device time at all

    def over(t: Tier) -> bool:
        return io.get(t, 0.0) > limit[0] * (1 + 1e-9)

    def over_guard(t: Tier) -> bool:
        """Whether a tier is past what growing a cache on it may leave: step 2's limit, or
        in step 3 (limit 0: any device time is worth relieving) the real budget."""
        return io.get(t, 0.0) > (limit[0] or io_budget) * (1 + 1e-9)

    def actions(table: ModelTable):
        tier, k, k2 = state[table.name]
        if k < 0:
            return
        now = cost(table, tier, k, k2).io_s
        relief = sum(s for t, s in now.items() if over(t))
        if relief <= 0 and limit[0] > 0.0:
            return
        for faster in backing[backing.index(tier) + 1:] if tier in backing else []:
            if faster != Tier.DRAM or k2 < 0:
                # Host DRAM also holds the L2 caches on a GPU node: a move there costs its bytes.
                yield (table.name, faster, k, k2, table.bytes * l2_weight if faster == Tier.DRAM and l2_ok else 0.0)
        if k + 1 < len(sizes[table.name]):
            yield (table.name, tier, k + 1, k2, fast_bytes(table, k + 1) - fast_bytes(table, k))
        if l2_ok and tier in (Tier.SCM, Tier.SSD) and k2 + 1 < len(l2_sizes[table.name]):
            extra = (l2_rows(table, k2 + 1) - l2_rows(table, k2)) * table.row_bytes * l2_weight
            yield (table.name, tier, k, k2 + 1, extra)
        if table.bytes <= whole_limit:
            yield (table.name, fast, -1, -1, fast_bytes(table, -1) - fast_bytes(table, k))

    def gain(name: str, tier: Tier, k: int, k2: int) -> float:
        table = by_name[name]
        old_tier, old_k, old_k2 = state[name]
        before, after = cost(table, old_tier, old_k, old_k2), cost(table, tier, k, k2)
        saved = sum(s for t, s in before.io_s.items() if over(t)) - sum(s for t, s in after.io_s.items() if over(t))
        if limit[0] == 0.0:  # phase 3: the cache's own compute counts too
            saved += before.compute_s - after.compute_s
        return saved

    heap: List[Tuple[float, str, int, Tier, int, int]] = []
    seq = 0

    def push(table: ModelTable) -> None:
        nonlocal seq
        for name, tier, k, k2, extra in actions(table):
            g = gain(name, tier, k, k2)
            if g > 0:
                seq += 1
                heapq.heappush(heap, (-g / max(extra, 1.0), name, seq, tier, k, k2))

    def relieve(until_empty: bool = False) -> None:
        while heap and (until_empty or any(over(t) for t in io)):
            step_once()

    def step_once() -> None:
        _, name, _, tier, k, k2 = heapq.heappop(heap)
        table = by_name[name]
        old_tier, old_k, old_k2 = state[name]
        valid = (tier == fast and k == -1) or (tier == old_tier and k2 == old_k2 and k == old_k + 1) or (
            tier == old_tier and k == old_k and k2 == old_k2 + 1) or (
            tier not in (old_tier, fast) and k == old_k and k2 == old_k2 and old_tier in backing
            and backing.index(tier) > backing.index(old_tier)
        )
        if old_k < 0 or not valid or gain(name, tier, k, k2) <= 0:
            return  # made stale by an earlier action
        dram_was_over = over_guard(Tier.DRAM)
        apply(table, old_tier, old_k, old_k2, -1.0)
        apply(table, tier, k, k2, 1.0)
        fits = all(used[t] <= caps[t] * (1 + 1e-9) for t in used)
        # Step 3 moves no table to a dearer tier (limit 0: any device time is "over"): it
        # spends the compute tier's bytes (and host DRAM's, as L2 caches within the budget).
        moved_onto_busy = (tier != fast and tier != old_tier and over(tier)) or (
            k2 > old_k2 and over_guard(Tier.DRAM) and not dram_was_over)
        if not fits or moved_onto_busy:
            apply(table, tier, k, k2, -1.0)
            apply(table, old_tier, old_k, old_k2, 1.0)
            return
        state[name] = (tier, k, k2)
        push(table)

    for table in model.tables:  # 2. relieve tiers over their budget
        push(table)
    relieve()
    busy = [t for t in io if over(t)]
    if busy and qps:
        raise _no_room(model, topo, world_size, caps, used, qps, busy)
    # 3. Spend what the compute tier has left on the remaining device time: it costs
    # nothing (the bytes are the job's anyway) and shortens the step.
    limit[0] = 0.0
    heap.clear()
    for table in model.tables:
        push(table)
    relieve(until_empty=True)  # the cache's own compute counts even where no device time is left
    if relax != 1.0:
        limit[0] = io_budget
        busy = [t for t in io if over(t)]
        if busy and qps:
            raise _no_room(model, topo, world_size, caps, used, qps, busy)
    placed = {name: (tier, 0.0 if k < 0 else sizes[name][k], l2_rows(by_name[name], k2))
              for name, (tier, k, k2) in state.items()}
    return _finish(model, topo, world_size, placed, used, caps, policy)


def _no_room(model, topo, world_size, caps, used, qps, busy=(), homeless=()) -> PlacementError:
    left = ", ".join(f"{t.name} {(caps[t] - used[t]) / 2**30:,.1f} GiB" for t in caps)
    if busy:
        why = f"tiers {', '.join(t.name for t in busy)} cannot feed {qps:,.0f} QPS"
    else:
        names = ", ".join(homeless[:5]) + (f" and {len(homeless) - 5} more" if len(homeless) > 5 else "")
        why = f"the tables do not fit (no tier holds {names})" if homeless else "the tables do not fit"
    return (_BusyTiers if busy else PlacementError)(
        f"{len(model.tables)} tables ({model.embedding_bytes / 2**30:,.1f} GiB) on {world_size} ranks of "
        f"{topo.name}: {why}; capacity left {left}"
    )


def _finish(model, topo, world_size, placed, used, caps, policy) -> Placement:
    tables, costs = {}, {}
    compute, io = 0.0, {}
    qps = model.target_qps or 0.0
    for table in model.tables:
        tier, rows, l2 = placed[table.name]
        cost = table_cost(table, tier, rows, topo, model.batch_size, policy, l2)
        costs[table.name] = cost
        compute += cost.compute_s
        for t, s in cost.io_s.items():
            io[t] = io.get(t, 0.0) + s
        tables[table.name] = TablePlacement(
            table.name, tier, int(round(rows)), cost.hit_rate,
            cost.tier_bytes_per_step * (qps / model.batch_size if qps else 0.0),
            extra={"l2_cache_rows": float(round(l2))} if l2 else {},
        )
    dense = topo.compute.dense_s_per_sample * model.batch_size
    step = step_seconds(compute / world_size, {t: s / world_size for t, s in io.items()}, dense / world_size)
    return Placement(world_size, tables, costs, used, caps, step, model.batch_size / step if step > 0 else float("inf"))
