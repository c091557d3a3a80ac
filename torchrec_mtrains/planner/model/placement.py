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
A table pinned to a tier (``ModelTable.pinned_tier``, from the planner's constraints) starts
there and never moves; its cache grows as any other's unless its size is pinned too.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torchrec_mtrains.planner.model.estimator import (
    TableCost,
    dense_step_seconds,
    kernel_step_seconds,
    step_seconds,
    table_cost,
)
from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.types import TablePlacement, TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["Placement", "PlacementError", "PlacementMemo", "place", "tier_bytes", "CACHE_FRACTIONS"]

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
    out = {tier: table.bytes_on(tier)}
    out[compute_tier] = out.get(compute_tier, 0.0) + cache_rows * table.row_bytes
    if l2_rows:
        out[Tier.DRAM] = out.get(Tier.DRAM, 0.0) + l2_rows * table.row_bytes
    return out


class PlacementError(ValueError):
    """The model does not fit the hardware at this size."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Each table's tier and cache on ``world_size`` ranks and what the perf model predicts:
    a rank's step (``predicted_step_s``, seconds) and the job's samples per second."""

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
    if table.pinned_cache_rows is not None:
        return [max(1.0, min(float(table.num_embeddings), table.pinned_cache_rows))]
    floor = min(float(table.num_embeddings), max(1.0, 2.0 * table.locality.unique_rows_per_step))
    sizes = sorted({max(floor, min(float(table.num_embeddings), f * table.num_embeddings)) for f in CACHE_FRACTIONS})
    return sizes


def _l2_sizes(table: ModelTable) -> List[float]:
    return [f * table.num_embeddings for f in _L2_FRACTIONS]


class PlacementMemo:
    """What placing one model on one node type under one cache policy works out again and
    again whatever the number of ranks, the budgets or the strategy: each table's cache
    sizes, the compute of all tables whole, and the perf model's cost and the bytes per
    tier of each table state. ``size_cluster`` shares one over all the sizes it tries.

    Args:
        model: the model placed.
        topo: the node type.
        policy: cache policy of the predicted hit rates, "lru" or "lfu".
    """

    def __init__(self, model: ModelSpec, topo: TieredTopology, policy: str = "lru") -> None:
        self.model, self.topo, self.policy = model, topo, policy
        self.fast = fast = topo.cache_tier()
        self.sizes = {t.name: _cache_sizes(t) for t in model.tables}
        self.l2_sizes = {t.name: _l2_sizes(t) for t in model.tables}
        # Compute seconds of all tables whole in the compute tier (sets the step budget without a target).
        self.compute_s = sum(table_cost(t, fast, 0.0, topo, model.batch_size).compute_s for t in model.tables)
        self.costs: Dict[Tuple[str, Tier, int, int], TableCost] = {}
        self.bytes: Dict[Tuple[str, Tier, int, int], Tuple[Tuple[Tier, float], ...]] = {}

    def check(self, model: ModelSpec, topo: TieredTopology, policy: str) -> None:
        """Raises ValueError if the memo was made for another model, node type or policy."""
        if model is not self.model or topo is not self.topo or policy != self.policy:
            raise ValueError(f"a PlacementMemo of {self.topo.name} / {self.policy!r} was given for another model, "
                             f"node type ({topo.name}) or policy ({policy!r})")

    def l2_rows(self, table: ModelTable, k2: int) -> float:
        return 0.0 if k2 < 0 else self.l2_sizes[table.name][k2]

    def cost(self, table: ModelTable, tier: Tier, k: int, k2: int) -> TableCost:
        """The perf model's cost of ``table`` in a state (memoized)."""
        key = (table.name, tier, k, k2)
        cost = self.costs.get(key)
        if cost is None:
            rows = 0.0 if k < 0 else self.sizes[table.name][k]
            cost = self.costs[key] = table_cost(table, tier, rows, self.topo, self.model.batch_size, self.policy,
                                                self.l2_rows(table, k2))
        return cost

    def tier_bytes(self, table: ModelTable, tier: Tier, k: int, k2: int) -> Tuple[Tuple[Tier, float], ...]:
        """``tier_bytes`` of ``table`` in a state, as (tier, bytes) pairs (memoized)."""
        key = (table.name, tier, k, k2)
        out = self.bytes.get(key)
        if out is None:
            rows = 0.0 if k < 0 else self.sizes[table.name][k]
            out = self.bytes[key] = tuple(tier_bytes(table, tier, rows, self.l2_rows(table, k2), self.fast).items())
        return out


def place(
    model: ModelSpec,
    topo: TieredTopology,
    world_size: int,
    tiers: Optional[Sequence[Tier]] = None,
    target_qps: Optional[float] = None,
    budget_bytes: Optional[Mapping[Tier, float]] = None,
    policy: str = "lru",
    max_tier_utilization: float = MAX_TIER_UTILIZATION,
    memo: Optional[PlacementMemo] = None,
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
    against the real budget.

    ``memo`` (optional) keeps what does not depend on ``world_size`` for the next call on
    the same model, node type and policy (``size_cluster`` passes one to all its sizes).

    Raises:
        ValueError: ``max_tier_utilization`` is not a finite number > 0, the target QPS
            (``target_qps``, or when that is 0 or None the model's) is not finite and >= 0,
            or ``memo`` was made for another model, node type or policy.
    """
    if not 0 < max_tier_utilization < float("inf"):
        raise ValueError(f"max_tier_utilization={max_tier_utilization!r} must be a finite number > 0")
    qps = target_qps or model.target_qps
    if qps is not None and not 0 <= qps < float("inf"):
        raise ValueError(f"target QPS {qps!r} must be a finite number >= 0")
    if memo is None:
        memo = PlacementMemo(model, topo, policy)
    memo.check(model, topo, policy)
    first: Optional[PlacementError] = None
    started: Dict[bool, _Started] = {}  # step 1 does not depend on the step-2 budget: run it once
    for fastest_first, relax in _STRATEGIES:
        placer = _Placer(model, topo, world_size, tiers, target_qps, budget_bytes, policy, max_tier_utilization,
                         relax, fastest_first, memo)
        try:
            return placer.run(started.get(fastest_first))
        except _BusyTiers as e:
            first = first or e
            started.setdefault(fastest_first, placer.started)
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
    memo: Optional[PlacementMemo] = None,
) -> Placement:
    """One attempt of ``place`` with one strategy, from step 1: step 2 steers by ``relax`` x
    the real budget, and step 1 starts tables on the fastest backing tier if ``fastest_first``."""
    memo = memo or PlacementMemo(model, topo, policy)
    return _Placer(model, topo, world_size, tiers, target_qps, budget_bytes, policy, max_tier_utilization,
                   relax, fastest_first, memo).run()


class _Phase(enum.Enum):
    """Which device time an action is credited for relieving."""

    RELIEVE = "relieve"  # step 2: the device time of tiers over the steering budget
    SPEND = "spend"  # step 3: any device time, and the cache's own compute


# A table's state: (tier, cache size index or -1 = whole in the compute tier, L2 cache size
# index or -1 = none). An action is the state it moves the table to, with its extra bytes.
_State = Tuple[Tier, int, int]
# What step 1 leaves: the tables' states, the bytes used and the device seconds per tier.
_Started = Tuple[Dict[str, _State], Dict[Tier, float], Dict[Tier, float]]


class _Placer:
    """One placement attempt: steps 1-3 of the module doc as methods over explicit state,
    with one strategy: step 2 steers by ``relax`` x the real budget, and step 1 starts
    tables on the fastest backing tier if ``fastest_first``.

    State: ``state`` (table name -> ``_State``), the bytes ``used`` and device seconds ``io``
    per tier (whole job) that the states add up to, the heap of candidate actions (best
    relief per byte of the compute tier first; entries made stale by a later action are
    skipped when popped), and the ``phase`` with the budgets it checks.
    """

    def __init__(self, model: ModelSpec, topo: TieredTopology, world_size: int, tiers: Optional[Sequence[Tier]],
                 target_qps: Optional[float], budget_bytes: Optional[Mapping[Tier, float]], policy: str,
                 max_tier_utilization: float, relax: float, fastest_first: bool, memo: PlacementMemo) -> None:
        self.model, self.topo, self.world_size, self.policy, self.memo = model, topo, world_size, policy, memo
        self.relax, self.fastest_first = relax, fastest_first
        self.fast = fast = topo.cache_tier()
        tiers = list(tiers) if tiers is not None else list(topo.tiers)
        if fast not in tiers or fast not in topo.tiers:
            raise PlacementError(f"the {topo.name} profile has no {fast.name} tier to compute in")
        self.caps = caps = _caps(topo, world_size, tiers, budget_bytes or {})
        self.used = {t: 0.0 for t in caps}
        self.qps = target_qps or model.target_qps
        self.backing = [t for t in _BACKING_ORDER if t in caps and t != fast]
        compute_s = memo.compute_s
        dense_s = dense_step_seconds(model, topo, world_size) * world_size
        step_budget = model.batch_size / self.qps if self.qps else (compute_s + dense_s) / world_size
        self.io_budget = step_budget * world_size * max_tier_utilization  # device seconds per step, all ranks
        self.steer = self.io_budget * relax  # the budget step 2 relieves tiers down to
        self.sizes = memo.sizes
        # On a GPU node a SCM/SSD table may also get a host-DRAM cache under its HBM one.
        self.l2_ok = topo.compute_device == "cuda" and Tier.DRAM in caps
        self.l2_sizes = memo.l2_sizes if self.l2_ok else {}
        # Host-DRAM bytes weigh what HBM bytes do, scaled by how much more of them there is.
        self.l2_weight = caps[fast] / caps[Tier.DRAM] if self.l2_ok and caps[Tier.DRAM] > 0 else 1.0
        self.by_name = {t.name: t for t in model.tables}
        # Largest table the compute tier takes whole from a backing tier (see the module doc).
        self.whole_limit = caps[fast] / world_size if topo.compute_device == "cpu" else float("inf")
        self.state: Dict[str, _State] = {}
        self.io: Dict[Tier, float] = {}
        self.phase = _Phase.RELIEVE
        self._over: Optional[Tuple[Tier, ...]] = None  # over_tiers(), until io or the phase changes
        # used[t] <= these for every t: the capacities, in the order of ``used`` (that of caps).
        self._cap_limits = tuple(caps[t] * (1 + 1e-9) for t in caps)
        self.started: Optional[_Started] = None  # set by step 1
        self._heap: List[Tuple[float, str, int, Tier, int, int]] = []
        self._seq = 0  # insertion order: ties in the heap go to the earlier action

    def run(self, started: Optional[_Started] = None) -> Placement:
        """Steps 1-3, or 2-3 from what step 1 of this strategy's start left (``started``);
        raises PlacementError (``_BusyTiers`` for tiers over budget)."""
        if started is None:
            self.start()
        else:
            self.state, self.used, self.io = (dict(d) for d in started)
            self.started, self._over = started, None
        self.relieve_busy_tiers()
        self.spend_leftover()
        if self.relax != 1.0:  # step 2 steered by a looser budget: check the real one
            self.check_busy(self.io_budget)
        placed = {name: (tier, 0.0 if k < 0 else self.sizes[name][k], self.l2_rows(self.by_name[name], k2))
                  for name, (tier, k, k2) in self.state.items()}
        costs = {name: self.cost(self.by_name[name], *where) for name, where in self.state.items()}
        return _finish(self.model, self.topo, self.world_size, placed, costs, self.used, self.caps)

    # ------------------------------------------------------------------ phases ----
    def start(self) -> None:
        """Step 1: every table on the cheapest (``fastest_first``: fastest) backing tier that
        holds it with its smallest cache, or whole in the compute tier."""
        fast = self.fast
        if self.fastest_first:
            start = list(reversed(self.backing))
            order = sorted(self.model.tables, key=lambda t: (-self._io_density(t), -t.bytes))
        else:
            start, order = self.backing, sorted(self.model.tables, key=lambda t: -t.bytes)
        homeless: List[str] = []  # whole in the compute tier because no other tier holds them
        for table in order:
            if table.pinned_tier is not None:
                self.pin(table)
                continue
            # Keep whole: a table whose smallest cache would hold half of it, or a small one (a
            # tiered table costs a fixed step overhead that its bytes do not repay).
            if self.fast_bytes(table, 0) >= 0.5 * table.bytes or table.bytes <= _SMALL_TABLE_BYTES:
                self.state[table.name] = (fast, -1, -1)
                self.apply(table, fast, -1, -1, 1.0)
                continue
            for tier in start:
                if (self.used[tier] + table.bytes_on(tier) <= self.caps[tier]
                        and self.used[fast] + self.fast_bytes(table, 0) <= self.caps[fast]):
                    self.state[table.name] = (tier, 0, -1)
                    break
            else:
                self.state[table.name] = (fast, -1, -1)
                homeless.append(table.name)
            self.apply(table, *self.state[table.name], 1.0)
        if self.used[fast] > self.caps[fast]:
            raise _no_room(self.model, self.topo, self.world_size, self.caps, self.used, self.qps, homeless=homeless)
        self.started = (dict(self.state), dict(self.used), dict(self.io))

    def pin(self, table: ModelTable) -> None:
        """Step 1 for a table its constraints pin to a tier: there, with its smallest (or
        pinned) cache; whole if the tier is the compute tier."""
        tier = table.pinned_tier
        if tier not in self.caps:
            raise PlacementError(f"table {table.name} is constrained to tier {tier.name}, which the "
                                 f"{self.topo.name} profile or the plan's tiers do not offer")
        where = (tier, -1, -1) if tier == self.fast else (tier, 0, -1)
        self.state[table.name] = where
        self.apply(table, *where, 1.0)
        if self.used[tier] > self.caps[tier]:
            raise PlacementError(f"table {table.name} is constrained to tier {tier.name}, which has no room for it "
                                 f"({self.used[tier] / 2**30:,.2f} of {self.caps[tier] / 2**30:,.2f} GiB)")

    def relieve_busy_tiers(self) -> None:
        """Step 2: the best actions on tables of tiers over the steering budget, until none is
        over it (or no action is left: then tiers over it fail a target)."""
        self.phase, self._over = _Phase.RELIEVE, None
        self._refill()
        while self._heap and self.over_tiers():
            self._take_best()
        self.check_busy(self.steer)

    def spend_leftover(self) -> None:
        """Step 3: what the compute tier has left goes to the remaining device time and the
        caches' own compute: it costs nothing (the bytes are the job's anyway) and shortens
        the step. Every action with a gain is taken."""
        self.phase, self._over = _Phase.SPEND, None
        self._refill()
        while self._heap:
            self._take_best()

    def check_busy(self, budget: float) -> None:
        """Raises ``_BusyTiers`` if, with a target, a tier's device time exceeds ``budget``."""
        busy = [t for t in self.io if self._past(t, budget)]
        if busy and self.qps:
            raise _no_room(self.model, self.topo, self.world_size, self.caps, self.used, self.qps, busy)

    # --------------------------------------------------------------- accounting ----
    def l2_rows(self, table: ModelTable, k2: int) -> float:
        return 0.0 if k2 < 0 else self.l2_sizes[table.name][k2]

    def cost(self, table: ModelTable, tier: Tier, k: int, k2: int = -1) -> TableCost:
        """The perf model's cost of ``table`` in a state (memoized)."""
        return self.memo.cost(table, tier, k, k2)

    def fast_bytes(self, table: ModelTable, k: int) -> float:
        """Bytes of the compute tier the table takes: whole (k < 0) or its cache."""
        return table.bytes if k < 0 else self.sizes[table.name][k] * table.row_bytes

    def apply(self, table: ModelTable, tier: Tier, k: int, k2: int, sign: float) -> None:
        """Adds (sign 1) or removes (sign -1) a table's bytes and device time in a state."""
        for t, b in self.memo.tier_bytes(table, tier, k, k2):
            self.used[t] += sign * b
        for t, sec in self.cost(table, tier, k, k2).io_s.items():
            self.io[t] = self.io.get(t, 0.0) + sign * sec
        self._over = None

    def _past(self, tier: Tier, budget: float) -> bool:
        return self.io.get(tier, 0.0) > budget * (1 + 1e-9)

    def over_tiers(self) -> Tuple[Tier, ...]:
        """The tiers whose device time counts as relief (``over``), worked out once per
        change of the device times or the phase: the heap's loop asks for them per action."""
        if self._over is None:
            limit = (self.steer if self.phase is _Phase.RELIEVE else 0.0) * (1 + 1e-9)
            self._over = tuple(t for t, sec in self.io.items() if sec > limit)
        return self._over

    def over(self, tier: Tier) -> bool:
        """Whether a tier's device time counts as relief: past the steering budget while
        relieving, any at all while spending."""
        return tier in self.over_tiers()

    def over_guard(self, tier: Tier) -> bool:
        """Whether a tier is past what growing a cache on it may leave: the steering budget
        while relieving, the real budget while spending."""
        return self._past(tier, self.steer if self.phase is _Phase.RELIEVE else self.io_budget)

    def _io_density(self, table: ModelTable) -> float:
        """Device seconds per byte of the table on the cheapest backing tier, smallest cache."""
        if not self.backing or not self.sizes[table.name]:
            return 0.0
        return sum(self.cost(table, self.backing[0], 0).io_s.values()) / table.bytes

    # ------------------------------------------------------------------ actions ----
    def actions(self, table: ModelTable) -> Iterator[Tuple[str, Tier, int, int, float]]:
        """(name, tier, k, k2, extra compute-tier bytes) of each action on a tiered table:
        a move to a faster backing tier, the next cache size, the next L2 cache size, or
        whole in the compute tier. While relieving, only tables on tiers over budget."""
        tier, k, k2 = self.state[table.name]
        if k < 0:
            return
        now, over = self.cost(table, tier, k, k2).io_s, self.over_tiers()
        relief = sum(s for t, s in now.items() if t in over)
        if relief <= 0 and self.phase is _Phase.RELIEVE:
            return
        moves = tier in self.backing and table.pinned_tier is None  # a pinned table keeps its tier
        for faster in self.backing[self.backing.index(tier) + 1:] if moves else []:
            if faster != Tier.DRAM or k2 < 0:
                # Host DRAM also holds the L2 caches on a GPU node: a move there costs its bytes.
                yield (table.name, faster, k, k2,
                       table.bytes * self.l2_weight if faster == Tier.DRAM and self.l2_ok else 0.0)
        if k + 1 < len(self.sizes[table.name]):
            yield (table.name, tier, k + 1, k2, self.fast_bytes(table, k + 1) - self.fast_bytes(table, k))
        if self.l2_ok and tier in (Tier.SCM, Tier.SSD) and k2 + 1 < len(self.l2_sizes[table.name]):
            extra = (self.l2_rows(table, k2 + 1) - self.l2_rows(table, k2)) * table.row_bytes * self.l2_weight
            yield (table.name, tier, k, k2 + 1, extra)
        if table.bytes <= self.whole_limit and table.pinned_tier is None:
            yield (table.name, self.fast, -1, -1, self.fast_bytes(table, -1) - self.fast_bytes(table, k))

    def gain(self, name: str, tier: Tier, k: int, k2: int) -> float:
        """Device seconds (and, while spending, compute seconds) an action saves."""
        table = self.by_name[name]
        before, after = self.cost(table, *self.state[name]), self.cost(table, tier, k, k2)
        over = self.over_tiers()
        saved = (sum(s for t, s in before.io_s.items() if t in over)
                 - sum(s for t, s in after.io_s.items() if t in over))
        if self.phase is _Phase.SPEND:
            saved += before.compute_s - after.compute_s
        return saved

    def push(self, table: ModelTable) -> None:
        """Queues the table's actions that gain, by gain per extra byte."""
        for name, tier, k, k2, extra in self.actions(table):
            g = self.gain(name, tier, k, k2)
            if g > 0:
                self._seq += 1
                heapq.heappush(self._heap, (-g / max(extra, 1.0), name, self._seq, tier, k, k2))

    def _refill(self) -> None:
        self._heap.clear()
        for table in self.model.tables:
            self.push(table)

    def _follows(self, old: _State, new: _State) -> bool:
        """Whether ``new`` is one action away from ``old`` (else the entry is stale)."""
        (old_tier, old_k, old_k2), (tier, k, k2) = old, new
        return (tier == self.fast and k == -1) or (tier == old_tier and k2 == old_k2 and k == old_k + 1) or (
            tier == old_tier and k == old_k and k2 == old_k2 + 1) or (
            tier not in (old_tier, self.fast) and k == old_k and k2 == old_k2 and old_tier in self.backing
            and self.backing.index(tier) > self.backing.index(old_tier)
        )

    def _take_best(self) -> None:
        """Pops the best action and takes it unless it is stale, breaks a capacity, or moves
        a table onto a busy tier (step 3 moves no table to a dearer tier: it spends the
        compute tier's bytes, and host DRAM's as L2 caches within the budget)."""
        _, name, _, tier, k, k2 = heapq.heappop(self._heap)
        table = self.by_name[name]
        old_tier, old_k, old_k2 = old = self.state[name]
        if old_k < 0 or not self._follows(old, (tier, k, k2)) or self.gain(name, tier, k, k2) <= 0:
            return
        dram_was_over = self.over_guard(Tier.DRAM)
        self.apply(table, old_tier, old_k, old_k2, -1.0)
        self.apply(table, tier, k, k2, 1.0)
        fits = all(u <= cap for u, cap in zip(self.used.values(), self._cap_limits))
        moved_onto_busy = (tier != self.fast and tier != old_tier and self.over(tier)) or (
            k2 > old_k2 and self.over_guard(Tier.DRAM) and not dram_was_over)
        if not fits or moved_onto_busy:
            self.apply(table, tier, k, k2, -1.0)
            self.apply(table, old_tier, old_k, old_k2, 1.0)
            return
        self.state[name] = (tier, k, k2)
        self.push(table)


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


def _finish(model, topo, world_size, placed, state_costs, used, caps) -> Placement:
    tables, costs = {}, {}
    compute, io = 0.0, {}
    qps = model.target_qps or 0.0
    for table in model.tables:
        tier, rows, l2 = placed[table.name]
        cost = state_costs[table.name]
        costs[table.name] = cost
        compute += cost.compute_s
        for t, s in cost.io_s.items():
            io[t] = io.get(t, 0.0) + s
        tables[table.name] = TablePlacement(
            table.name, tier, int(round(rows)), cost.hit_rate,
            cost.tier_bytes_per_step * (qps / model.batch_size if qps else 0.0),
            extra={"l2_cache_rows": float(round(l2))} if l2 else {},
        )
    dense = dense_step_seconds(model, topo, world_size)
    kernel = kernel_step_seconds(topo, any(rows > 0 for _, rows, _ in placed.values()))
    step = step_seconds(compute / world_size + kernel, {t: s / world_size for t, s in io.items()}, dense)
    return Placement(world_size, tables, costs, used, caps, step, model.batch_size / step if step > 0 else float("inf"))
