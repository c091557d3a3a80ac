"""What the placement search works with: a table's state (tier, cache, L2 cache), the
memoized cost and bytes of each state, the limits a placement keeps (each tier's capacity
and device-time budget), the one check of device time against a budget, and the result
and errors a placement gives."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from torchrec_mtrains.planner.model.estimator import TableCost, dense_step_seconds, table_cost
from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.types import TablePlacement, TieredTopology
from torchrec_mtrains.slot_map import dense_map_bytes, dense_map_pays
from torchrec_mtrains.types import Tier

__all__ = [
    "CACHE_FRACTIONS",
    "MAX_TIER_UTILIZATION",
    "BusyTiersError",
    "Limits",
    "Placement",
    "PlacementError",
    "PlacementMemo",
    "Started",
    "TableState",
    "cache_index_bytes",
    "format_size",
    "no_room",
    "over_budget",
    "tier_bytes",
    "whole_in",
]

CACHE_FRACTIONS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
_L2_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0)
MAX_TIER_UTILIZATION = 0.5
"""Share of a step a tier's device may be busy: queues and the I/O's own CPU work (on a CPU
node it shares the cores with compute) make a device near saturation slow the step (the
kernel benchmark's SSD step ran 1.34x its device time when the device was the bound)."""
_BACKING_ORDER = (Tier.SSD, Tier.SCM, Tier.DRAM)  # cheapest first
_SLACK = 1 + 1e-9  # float sums of the same terms in another order differ by rounding


def format_size(nbytes: float) -> str:
    """Bytes for a message: MiB below a GiB, else GiB, one decimal."""
    return f"{nbytes / 2**30:,.1f} GiB" if abs(nbytes) >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"


class PlacementError(ValueError):
    """The model does not fit the hardware at this size."""


class BusyTiersError(PlacementError):
    """Tiers stay over their device-time budget (``place`` then tries another strategy)."""


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


class TableState(NamedTuple):
    """Where the search has a table: its rows on ``tier``, with the cache size ``cache``
    (an index into its cache sizes; None: the table is whole in the compute tier, which is
    then ``tier``) and, on a GPU node, the host-DRAM L2 cache size ``l2`` (an index into its
    L2 sizes; None: no L2 cache). An action is the state it moves a table to."""

    tier: Tier
    cache: Optional[int]
    l2: Optional[int] = None

    @property
    def whole(self) -> bool:
        """Whether the table is whole in the compute tier (no cache)."""
        return self.cache is None

    def next_l2(self) -> int:
        """The index of the next larger L2 cache."""
        return 0 if self.l2 is None else self.l2 + 1

    def grows_l2(self, before: "TableState") -> bool:
        """Whether this state has a larger L2 cache than ``before``."""
        return self.l2 is not None and (before.l2 is None or self.l2 > before.l2)


def whole_in(tier: Tier) -> TableState:
    """The state of a table whole in ``tier`` (the compute tier)."""
    return TableState(tier, None, None)


class Started(NamedTuple):
    """What step 1 of the search leaves: the tables' states, the bytes used and the device
    seconds per tier (whole job)."""

    states: Dict[str, TableState]
    used: Dict[Tier, float]
    io: Dict[Tier, float]


def over_budget(io: Mapping[Tier, float], budget: float) -> Tuple[Tier, ...]:
    """The tiers whose device seconds per step in ``io`` exceed ``budget`` (seconds)."""
    return tuple(t for t, seconds in io.items() if seconds > budget * _SLACK)


def cache_index_bytes(table: ModelTable, cache_rows: float) -> float:
    """Host-DRAM bytes a cache of ``cache_rows`` adds for its index beyond its rows: the
    dense row-to-slot map, where the kernel's rule keeps one (``torchrec_mtrains/slot_map.py``:
    4 bytes a table row, kept where that is at most an eighth of the cache's row bytes)."""
    pays = dense_map_pays(table.num_embeddings, cache_rows, table.row_bytes)
    return dense_map_bytes(table.num_embeddings) if pays else 0.0


def tier_bytes(table: ModelTable, tier: Tier, cache_rows: float, l2_rows: float, compute_tier: Tier) -> Dict[Tier, float]:
    """A table's bytes on each tier: whole in ``compute_tier`` (no cache), or its rows on
    ``tier`` with a cache of ``cache_rows`` in the compute tier and, on a GPU node, an L2
    cache of ``l2_rows`` in host DRAM. The CPU kernel's dense row-to-slot map, where the rule
    keeps one (``cache_index_bytes``), and a virtual table's id index are in host DRAM too."""
    if tier == compute_tier and cache_rows <= 0:
        out = {compute_tier: table.bytes}
    else:
        out = {tier: table.bytes_on(tier)}
        out[compute_tier] = out.get(compute_tier, 0.0) + cache_rows * table.row_bytes
        if l2_rows:
            out[Tier.DRAM] = out.get(Tier.DRAM, 0.0) + l2_rows * table.row_bytes
        # The map belongs to the CPU kernel's index, beside its cache in DRAM; a device cache
        # (compute tier HBM) has no such map.
        index = cache_index_bytes(table, cache_rows) if compute_tier == Tier.DRAM else 0.0
        if index:
            out[Tier.DRAM] = out.get(Tier.DRAM, 0.0) + index
    if table.index_bytes_per_row:
        out[Tier.DRAM] = out.get(Tier.DRAM, 0.0) + float(table.num_embeddings) * table.index_bytes_per_row
    return out


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
        self.compute_tier = compute_tier = topo.cache_tier()  # where caches and whole tables live
        self.sizes = {t.name: _cache_sizes(t) for t in model.tables}
        self.l2_sizes = {t.name: _l2_sizes(t) for t in model.tables}
        # Compute seconds of all tables whole in the compute tier (sets the step budget without a target).
        self.compute_s = sum(table_cost(t, compute_tier, 0.0, topo, model.batch_size).compute_s for t in model.tables)
        self.costs: Dict[Tuple[str, TableState], TableCost] = {}
        self.bytes: Dict[Tuple[str, TableState], Tuple[Tuple[Tier, float], ...]] = {}

    def check(self, model: ModelSpec, topo: TieredTopology, policy: str) -> None:
        """Raises ValueError if the memo was made for another model, node type or policy."""
        if model is not self.model or topo is not self.topo or policy != self.policy:
            raise ValueError(f"a PlacementMemo of {self.topo.name} / {self.policy!r} was given for another model, "
                             f"node type ({topo.name}) or policy ({policy!r})")

    def cache_rows(self, table: ModelTable, cache: Optional[int]) -> float:
        """Rows of the table's cache of size index ``cache`` (0 for a whole table)."""
        return 0.0 if cache is None else self.sizes[table.name][cache]

    def l2_rows(self, table: ModelTable, l2: Optional[int]) -> float:
        """Rows of the table's L2 cache of size index ``l2`` (0 for none)."""
        return 0.0 if l2 is None else self.l2_sizes[table.name][l2]

    def cost(self, table: ModelTable, state: TableState) -> TableCost:
        """The perf model's cost of ``table`` in ``state`` (memoized)."""
        key = (table.name, state)
        cost = self.costs.get(key)
        if cost is None:
            cost = self.costs[key] = table_cost(table, state.tier, self.cache_rows(table, state.cache), self.topo,
                                                self.model.batch_size, self.policy, self.l2_rows(table, state.l2))
        return cost

    def tier_bytes(self, table: ModelTable, state: TableState) -> Tuple[Tuple[Tier, float], ...]:
        """``tier_bytes`` of ``table`` in ``state``, as (tier, bytes) pairs (memoized)."""
        key = (table.name, state)
        out = self.bytes.get(key)
        if out is None:
            out = self.bytes[key] = tuple(tier_bytes(table, state.tier, self.cache_rows(table, state.cache),
                                                     self.l2_rows(table, state.l2), self.compute_tier).items())
        return out


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a placement of the memo's model on ``world_size`` ranks must keep, whatever the
    strategy: each tier's capacity (``caps``, bytes, whole job) and the device seconds per
    step a tier may be busy (``io_budget``, all ranks together), with the tiers and caches
    the node offers.

    ``backing``: the tiers a table's rows may live on behind a cache, cheapest first;
    ``l2_ok``: SCM/SSD tables may also get a host-DRAM cache under their HBM one (a GPU
    node), whose bytes weigh ``l2_weight`` compute-tier bytes each; ``whole_limit``: the
    largest table the compute tier takes whole from a backing tier (see ``placement_search``).
    """

    compute_tier: Tier
    caps: Dict[Tier, float]
    qps: Optional[float]  # the target, None or 0 for none
    io_budget: float
    backing: Tuple[Tier, ...]
    l2_ok: bool
    l2_weight: float
    whole_limit: float
    cap_limits: Tuple[float, ...]  # caps with rounding slack, in the order of ``caps``
    budgeted: Tuple[Tier, ...] = ()  # the tiers whose cap is the caller's budget (else the node's x ranks)

    def fits(self, used: Mapping[Tier, float]) -> bool:
        """Whether ``used`` (bytes per tier, in the order of ``caps``) keeps every capacity."""
        return all(u <= cap for u, cap in zip(used.values(), self.cap_limits))

    @classmethod
    def of(
        cls,
        memo: PlacementMemo,
        world_size: int,
        tiers: Optional[Sequence[Tier]] = None,
        target_qps: Optional[float] = None,
        budget_bytes: Optional[Mapping[Tier, float]] = None,
        max_tier_utilization: float = MAX_TIER_UTILIZATION,
    ) -> "Limits":
        """The limits of ``place``'s arguments (see there).

        Raises:
            PlacementError: the node (or ``tiers``) has no compute tier.
        """
        model, topo, compute_tier = memo.model, memo.topo, memo.compute_tier
        tiers = list(tiers) if tiers is not None else list(topo.tiers)
        if compute_tier not in tiers or compute_tier not in topo.tiers:
            raise PlacementError(f"the {topo.name} profile has no {compute_tier.name} tier to compute in")
        budget = budget_bytes or {}
        caps = {t: budget.get(t, topo.tiers[t].capacity_bytes * world_size) for t in tiers if t in topo.tiers}
        qps = target_qps or model.target_qps
        dense_s = dense_step_seconds(model, topo, world_size) * world_size
        step_budget = model.batch_size / qps if qps else (memo.compute_s + dense_s) / world_size
        l2_ok = topo.compute_device == "cuda" and Tier.DRAM in caps
        return cls(
            compute_tier=compute_tier,
            caps=caps,
            qps=qps,
            io_budget=step_budget * world_size * max_tier_utilization,
            backing=tuple(t for t in _BACKING_ORDER if t in caps and t != compute_tier),
            l2_ok=l2_ok,
            # Host-DRAM bytes weigh what HBM bytes do, scaled by how much more of them there is.
            l2_weight=caps[compute_tier] / caps[Tier.DRAM] if l2_ok and caps[Tier.DRAM] > 0 else 1.0,
            whole_limit=caps[compute_tier] / world_size if topo.compute_device == "cpu" else float("inf"),
            cap_limits=tuple(cap * _SLACK for cap in caps.values()),
            budgeted=tuple(t for t in caps if t in budget),
        )

    def cap_words(self, tier: Tier, world_size: int) -> str:
        """``tier``'s cap for a message: "the job's DRAM budget is 8.0 MiB" or "the job's DRAM
        is 16.0 GiB (2 ranks' capacity)"."""
        if tier in self.budgeted:
            return f"the job's {tier.name} budget is {format_size(self.caps[tier])}"
        return f"the job's {tier.name} is {format_size(self.caps[tier])} ({world_size} ranks' capacity)"


def no_room(memo: PlacementMemo, world_size: int, limits: Limits, used: Mapping[Tier, float],
            busy: Sequence[Tier] = (), homeless: Sequence[str] = (), reasons: Sequence[str] = ()) -> PlacementError:
    """The error of a placement that does not fit: ``busy`` tiers over their device-time
    budget (a ``BusyTiersError``), or tables no tier holds (``homeless``, each with the
    reason in ``reasons``: what it needs of which tier). ``used``: the bytes of the tables
    placed, the homeless ones left out; a tier they overfill is reported as over its cap."""
    model, caps = memo.model, limits.caps
    left = ", ".join(f"{t.name} {format_size(max(0.0, caps[t] - used[t]))}" for t in caps)
    if busy:
        why = f"tiers {', '.join(t.name for t in busy)} cannot feed {limits.qps:,.0f} QPS"
    else:
        names = ", ".join(homeless[:5]) + (f" and {len(homeless) - 5} more" if len(homeless) > 5 else "")
        why = f"the tables do not fit (no tier holds {names})" if homeless else "the tables do not fit"
        over = [t for t in caps if used[t] > caps[t] * _SLACK]
        if over:
            why += "; " + "; ".join(f"the tables placed take {format_size(used[t])} of {t.name}, and "
                                    f"{limits.cap_words(t, world_size)}" for t in over)
        if reasons:
            why += "; " + "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
    return (BusyTiersError if busy else PlacementError)(
        f"{len(model.tables)} tables ({format_size(model.embedding_bytes)}) on {world_size} ranks of "
        f"{memo.topo.name}: {why}; capacity left {left}"
    )
