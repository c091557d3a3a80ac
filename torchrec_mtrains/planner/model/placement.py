"""Placement: each table's tier and cache size for a given number of ranks (``place``).

``place`` runs the search of ``placement_search`` (its module doc gives the steps) with one
``Strategy`` after another until one meets the device-time budget. The values the search
works with -- a table's state, the memo of their costs, the limits a placement keeps, the
result and its errors -- are in ``placement_state``; the names users import stay here.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

from torchrec_mtrains.planner.model.model_spec import ModelSpec
from torchrec_mtrains.planner.model.placement_search import STRATEGIES, Placer
from torchrec_mtrains.planner.model.placement_state import (
    CACHE_FRACTIONS,
    MAX_TIER_UTILIZATION,
    BusyTiersError,
    Limits,
    Placement,
    PlacementError,
    PlacementMemo,
    Started,
    tier_bytes,
)
from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["Placement", "PlacementError", "PlacementMemo", "place", "tier_bytes", "CACHE_FRACTIONS"]


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

    Relieving the tiers over budget (step 2 of the search) is greedy and can strand: while
    every cache is small a faster tier is over budget too, so tables stay on a slow tier
    whose load no cache the compute tier can still afford brings down. If it fails that
    way, steps 2 and 3 run again with step 2 steering by a looser budget (``STRATEGIES``:
    tables move to the faster tiers first, step 3 then grows every cache), and the result
    is checked against the real budget.

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
    limits = Limits.of(memo, world_size, tiers, target_qps, budget_bytes, max_tier_utilization)
    first: Optional[PlacementError] = None
    started: Dict[bool, Started] = {}  # step 1 does not depend on the step-2 budget: run it once
    for strategy in STRATEGIES:
        placer = Placer(memo, world_size, limits, strategy)
        try:
            return placer.run(started.get(strategy.fastest_first))
        except BusyTiersError as e:
            first = first or e
            started.setdefault(strategy.fastest_first, placer.started)
    raise first
