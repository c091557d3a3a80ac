"""The placement search: each table's tier and cache size for a given number of ranks.

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

Step 2 is greedy and can strand; ``place`` then runs the search again with another
``Strategy`` (``STRATEGIES``, in the order it tries them).
"""

from __future__ import annotations

import enum
import heapq
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from torchrec_mtrains.planner.model.estimator import dense_step_seconds, kernel_step_seconds, step_seconds
from torchrec_mtrains.planner.model.model_spec import ModelTable
from torchrec_mtrains.planner.model.placement_state import (
    Limits,
    Placement,
    PlacementError,
    PlacementMemo,
    Started,
    TableState,
    cache_index_bytes,
    format_size,
    no_room,
    over_budget,
    whole_in,
)
from torchrec_mtrains.planner.types import TablePlacement
from torchrec_mtrains.types import Tier

__all__ = ["STRATEGIES", "Placer", "Strategy"]

_SMALL_TABLE_BYTES = 4 << 20


class Strategy(NamedTuple):
    """How one search runs: step 1 starts tables on the fastest backing tier if
    ``fastest_first`` (else the cheapest), and step 2 steers by ``relax`` x the real budget
    (the result is then checked against the real one)."""

    fastest_first: bool
    relax: float


_RELAXED = (4.0, 16.0)  # looser step-2 budgets tried when the real one strands
STRATEGIES = (
    (Strategy(False, 1.0),) + tuple(Strategy(False, r) for r in _RELAXED)
    + (Strategy(True, 1.0),) + tuple(Strategy(True, r) for r in _RELAXED)
)


class _Phase(enum.Enum):
    """Which device time an action is credited for relieving."""

    RELIEVE = "relieve"  # step 2: the device time of tiers over the steering budget
    SPEND = "spend"  # step 3: any device time, and the cache's own compute


class Placer:
    """One search with one ``strategy``: steps 1-3 of the module doc as methods over
    explicit state.

    State: ``state`` (table name -> ``TableState``), the bytes ``used`` and device seconds
    ``io`` per tier (whole job) that the states add up to, the heap of candidate actions
    (best relief per byte of the compute tier first; entries made stale by a later action
    are skipped when popped), and the ``phase`` with the budgets it checks.

    Args:
        memo: the model, node type and policy, with what they work out again and again.
        world_size: ranks of the job.
        limits: capacities and device-time budget of the job (``Limits.of``).
        strategy: how this search runs.
    """

    def __init__(self, memo: PlacementMemo, world_size: int, limits: Limits, strategy: Strategy) -> None:
        self.memo, self.world_size, self.limits, self.strategy = memo, world_size, limits, strategy
        self.model = memo.model
        self.compute_tier = limits.compute_tier
        self.backing = limits.backing
        self.steer = limits.io_budget * strategy.relax  # the budget step 2 relieves tiers down to
        self.by_name = {t.name: t for t in self.model.tables}
        self.state: Dict[str, TableState] = {}
        self.used = {t: 0.0 for t in limits.caps}
        self.io: Dict[Tier, float] = {}
        self.phase = _Phase.RELIEVE
        self._over: Optional[Tuple[Tier, ...]] = None  # over_tiers(), until io or the phase changes
        self.started: Optional[Started] = None  # set by step 1
        self._heap: List[Tuple[float, str, int, TableState]] = []
        self._seq = 0  # insertion order: ties in the heap go to the earlier action

    def run(self, started: Optional[Started] = None) -> Placement:
        """Steps 1-3, or 2-3 from what step 1 of this strategy's start left (``started``);
        raises PlacementError (``BusyTiersError`` for tiers over budget)."""
        if started is None:
            self.start()
        else:
            self.state, self.used, self.io = dict(started.states), dict(started.used), dict(started.io)
            self.started, self._over = started, None
        self.relieve_busy_tiers()
        self.spend_leftover()
        if self.strategy.relax != 1.0:  # step 2 steered by a looser budget: check the real one
            self.check_busy(self.limits.io_budget)
        return self.placement()

    # ------------------------------------------------------------------ phases ----
    def start(self) -> None:
        """Step 1: every table on the cheapest (``fastest_first``: fastest) backing tier that
        holds it with its smallest cache, or whole in the compute tier."""
        compute_tier, caps = self.compute_tier, self.limits.caps
        if self.strategy.fastest_first:
            start = tuple(reversed(self.backing))
            order = sorted(self.model.tables, key=lambda t: (-self._io_density(t), -t.bytes))
        else:
            start, order = self.backing, sorted(self.model.tables, key=lambda t: -t.bytes)
        # Tables whole in the compute tier because no other tier holds them, each with the
        # bytes of the tables placed before it (for the error), and their own bytes.
        homeless: List[Tuple[ModelTable, Dict[Tier, float]]] = []
        set_aside = {t: 0.0 for t in caps}
        for table in order:
            if table.pinned_tier is not None:
                self.pin(table)
                continue
            # Keep whole: a table whose smallest cache would hold half of it, or a small one (a
            # tiered table costs a fixed step overhead that its bytes do not repay).
            if self.compute_bytes(table, 0) >= 0.5 * table.bytes or table.bytes <= _SMALL_TABLE_BYTES:
                state = whole_in(compute_tier)
            else:
                for tier in start:
                    if (self.used[tier] + table.bytes_on(tier) <= caps[tier]
                            and self.used[compute_tier] + self.compute_bytes(table, 0) <= caps[compute_tier]):
                        state = TableState(tier, 0)
                        break
                else:
                    state = whole_in(compute_tier)
                    homeless.append((table, {t: self.used[t] - set_aside[t] for t in caps}))
                    for t, b in self.memo.tier_bytes(table, state):
                        set_aside[t] += b
            self.state[table.name] = state
            self.apply(table, state, 1.0)
        if self.used[compute_tier] > caps[compute_tier]:
            raise no_room(self.memo, self.world_size, self.limits, {t: self.used[t] - set_aside[t] for t in caps},
                          homeless=[table.name for table, _ in homeless],
                          reasons=[self.homeless_reason(table, start, placed) for table, placed in homeless])
        self.started = Started(dict(self.state), dict(self.used), dict(self.io))

    def homeless_reason(self, table: ModelTable, backing: Tuple[Tier, ...], used: Dict[Tier, float]) -> str:
        """Why no tier holds ``table`` in step 1, ``used`` being the bytes of the tables placed
        so far (tables no tier holds left out): what its smallest row cache needs of the
        compute tier, what its rows need of the ``backing`` tiers without room, what it needs
        whole, against what the compute tier has."""
        compute_tier, caps = self.compute_tier, self.limits.caps
        name = compute_tier.name
        rows = self.memo.sizes[table.name][0]
        smallest = "its constraints' size" if table.pinned_cache_rows is not None \
            else f"the smallest the planner sizes at the global batch of {self.model.batch_size:,}"
        roomy = [t for t in backing if used[t] + table.bytes_on(t) <= caps[t]]
        parts = []
        if roomy:
            parts.append(f"on {' or '.join(t.name for t in roomy)} it needs a row cache of at least {rows:,.0f} rows "
                         f"({smallest}): {format_size(self.compute_bytes(table, 0))} of {name}")
        parts += [f"{t.name} has {format_size(max(0.0, caps[t] - used[t]))} left for its rows' "
                  f"{format_size(table.bytes_on(t))}" for t in backing if t not in roomy]
        if not backing:
            parts.append(f"no tier but {name} is offered")
        parts.append(f"whole it needs {format_size(table.bytes)} of {name}")
        left = format_size(max(0.0, caps[compute_tier] - used[compute_tier]))
        return (f"table {table.name} ({table.num_embeddings:,} rows, {format_size(table.bytes)}): "
                f"{'; '.join(parts)}; {self.limits.cap_words(compute_tier, self.world_size)} ({left} left)")

    def pin(self, table: ModelTable) -> None:
        """Step 1 for a table its constraints pin to a tier: there, with its smallest (or
        pinned) cache; whole if the tier is the compute tier."""
        tier, caps = table.pinned_tier, self.limits.caps
        if tier not in caps:
            raise PlacementError(f"table {table.name} is constrained to tier {tier.name}, which the "
                                 f"{self.memo.topo.name} profile or the plan's tiers do not offer")
        state = whole_in(tier) if tier == self.compute_tier else TableState(tier, 0)
        self.state[table.name] = state
        self.apply(table, state, 1.0)
        if self.used[tier] > caps[tier]:
            raise PlacementError(f"table {table.name} is constrained to tier {tier.name}, which has no room for it "
                                 f"({self.used[tier] / 2**30:,.2f} of {caps[tier] / 2**30:,.2f} GiB)")

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
        """Raises ``BusyTiersError`` if, with a target, a tier's device time exceeds ``budget``."""
        busy = over_budget(self.io, budget)
        if busy and self.limits.qps:
            raise no_room(self.memo, self.world_size, self.limits, self.used, busy)

    def placement(self) -> Placement:
        """The tables' states as a ``Placement``, with the step the perf model predicts."""
        memo, model, topo, world_size = self.memo, self.model, self.memo.topo, self.world_size
        tables, costs = {}, {}
        compute, io = 0.0, {}
        qps = model.target_qps or 0.0
        cached = False  # any table behind a cache
        for table in model.tables:
            state = self.state[table.name]
            rows, l2 = memo.cache_rows(table, state.cache), memo.l2_rows(table, state.l2)
            cost = costs[table.name] = memo.cost(table, state)
            cached = cached or rows > 0
            compute += cost.compute_s
            for t, s in cost.io_s.items():
                io[t] = io.get(t, 0.0) + s
            tables[table.name] = TablePlacement(
                table.name, state.tier, int(round(rows)), cost.hit_rate,
                cost.tier_bytes_per_step * (qps / model.batch_size if qps else 0.0),
                extra={"l2_cache_rows": float(round(l2))} if l2 else {},
            )
        dense = dense_step_seconds(model, topo, world_size)
        kernel = kernel_step_seconds(topo, cached)
        step = step_seconds(compute / world_size + kernel, {t: s / world_size for t, s in io.items()}, dense)
        return Placement(world_size, tables, costs, self.used, dict(self.limits.caps), step,
                         model.batch_size / step if step > 0 else float("inf"))

    # --------------------------------------------------------------- accounting ----
    def compute_bytes(self, table: ModelTable, cache: Optional[int]) -> float:
        """Bytes of the compute tier the table takes: whole (``cache`` None) or its cache
        (with its index's dense map when the compute tier is host DRAM)."""
        if cache is None:
            return table.bytes
        rows = self.memo.sizes[table.name][cache]
        index = cache_index_bytes(table, rows) if self.compute_tier is Tier.DRAM else 0.0
        return rows * table.row_bytes + index

    def apply(self, table: ModelTable, state: TableState, sign: float) -> None:
        """Adds (sign 1) or removes (sign -1) a table's bytes and device time in a state."""
        for t, b in self.memo.tier_bytes(table, state):
            self.used[t] += sign * b
        for t, sec in self.memo.cost(table, state).io_s.items():
            self.io[t] = self.io.get(t, 0.0) + sign * sec
        self._over = None

    def over_tiers(self) -> Tuple[Tier, ...]:
        """The tiers whose device time counts as relief (``over``), worked out once per
        change of the device times or the phase: the heap's loop asks for them per action."""
        if self._over is None:
            self._over = over_budget(self.io, self.steer if self.phase is _Phase.RELIEVE else 0.0)
        return self._over

    def over(self, tier: Tier) -> bool:
        """Whether a tier's device time counts as relief: past the steering budget while
        relieving, any at all while spending."""
        return tier in self.over_tiers()

    def over_guard(self, tier: Tier) -> bool:
        """Whether a tier is past what growing a cache on it may leave: the steering budget
        while relieving, the real budget while spending."""
        return tier in over_budget(self.io, self.steer if self.phase is _Phase.RELIEVE else self.limits.io_budget)

    def _io_density(self, table: ModelTable) -> float:
        """Device seconds per byte of the table on the cheapest backing tier, smallest cache."""
        if not self.backing or not self.memo.sizes[table.name]:
            return 0.0
        return sum(self.memo.cost(table, TableState(self.backing[0], 0)).io_s.values()) / table.bytes

    # ------------------------------------------------------------------ actions ----
    def actions(self, table: ModelTable) -> Iterator[Tuple[TableState, float]]:
        """(state, extra compute-tier bytes) of each action on a tiered table: a move to a
        faster backing tier, the next cache size, the next L2 cache size, or whole in the
        compute tier. While relieving, only tables on tiers over budget."""
        state = self.state[table.name]
        if state.whole:
            return
        tier, k, l2 = state
        now, over = self.memo.cost(table, state).io_s, self.over_tiers()
        relief = sum(s for t, s in now.items() if t in over)
        if relief <= 0 and self.phase is _Phase.RELIEVE:
            return
        memo, limits = self.memo, self.limits
        moves = tier in self.backing and table.pinned_tier is None  # a pinned table keeps its tier
        for faster in self.backing[self.backing.index(tier) + 1:] if moves else ():
            if faster != Tier.DRAM or l2 is None:
                # Host DRAM also holds the L2 caches on a GPU node: a move there costs its bytes.
                yield (TableState(faster, k, l2),
                       table.bytes * limits.l2_weight if faster == Tier.DRAM and limits.l2_ok else 0.0)
        if k + 1 < len(memo.sizes[table.name]):
            yield (TableState(tier, k + 1, l2), self.compute_bytes(table, k + 1) - self.compute_bytes(table, k))
        if limits.l2_ok and tier in (Tier.SCM, Tier.SSD) and state.next_l2() < len(memo.l2_sizes[table.name]):
            grown = TableState(tier, k, state.next_l2())
            extra = (memo.l2_rows(table, grown.l2) - memo.l2_rows(table, l2)) * table.row_bytes * limits.l2_weight
            yield (grown, extra)
        if table.bytes <= limits.whole_limit and table.pinned_tier is None:
            yield (whole_in(self.compute_tier), self.compute_bytes(table, None) - self.compute_bytes(table, k))

    def gain(self, table: ModelTable, after: TableState) -> float:
        """Device seconds (and, while spending, compute seconds) moving the table to
        ``after`` saves."""
        before, now = self.memo.cost(table, self.state[table.name]), self.memo.cost(table, after)
        over = self.over_tiers()
        saved = (sum(s for t, s in before.io_s.items() if t in over)
                 - sum(s for t, s in now.io_s.items() if t in over))
        if self.phase is _Phase.SPEND:
            saved += before.compute_s - now.compute_s
        return saved

    def push(self, table: ModelTable) -> None:
        """Queues the table's actions that gain, by gain per extra byte."""
        for state, extra in self.actions(table):
            g = self.gain(table, state)
            if g > 0:
                self._seq += 1
                heapq.heappush(self._heap, (-g / max(extra, 1.0), table.name, self._seq, state))

    def _refill(self) -> None:
        self._heap.clear()
        for table in self.model.tables:
            self.push(table)

    def _follows(self, old: TableState, new: TableState) -> bool:
        """Whether ``new`` is one action away from ``old`` (a table behind a cache; else the
        entry is stale)."""
        backing = self.backing
        return (new.tier == self.compute_tier and new.whole) or (
            new.tier == old.tier and new.l2 == old.l2 and new.cache == old.cache + 1) or (
            new.tier == old.tier and new.cache == old.cache and new.l2 == old.next_l2()) or (
            new.tier not in (old.tier, self.compute_tier) and new.cache == old.cache and new.l2 == old.l2
            and old.tier in backing and backing.index(new.tier) > backing.index(old.tier)
        )

    def _take_best(self) -> None:
        """Pops the best action and takes it unless it is stale, breaks a capacity, or moves
        a table onto a busy tier (step 3 moves no table to a dearer tier: it spends the
        compute tier's bytes, and host DRAM's as L2 caches within the budget)."""
        _, name, _, new = heapq.heappop(self._heap)
        table = self.by_name[name]
        old = self.state[name]
        if old.whole or not self._follows(old, new) or self.gain(table, new) <= 0:
            return
        dram_was_over = self.over_guard(Tier.DRAM)
        self.apply(table, old, -1.0)
        self.apply(table, new, 1.0)
        moved_onto_busy = (new.tier != self.compute_tier and new.tier != old.tier and self.over(new.tier)) or (
            new.grows_l2(old) and self.over_guard(Tier.DRAM) and not dram_was_over)
        if not self.limits.fits(self.used) or moved_onto_busy:
            self.apply(table, new, -1.0)
            self.apply(table, old, 1.0)
            return
        self.state[name] = new
        self.push(table)
