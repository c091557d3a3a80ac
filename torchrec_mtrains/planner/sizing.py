"""How many nodes a model needs: the fewest whose placement meets the target QPS."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from torchrec_mtrains.planner.model_spec import ModelSpec
from torchrec_mtrains.planner.placement import Placement, PlacementError, place
from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["size_cluster"]


def size_cluster(
    model: ModelSpec,
    topo: TieredTopology,
    tiers: Optional[Sequence[Tier]] = None,
    max_nodes: int = 100_000,
    policy: str = "lru",
) -> Tuple[int, Placement]:
    """(nodes, placement) of the fewest nodes of ``topo`` that hold ``model`` and meet its
    target QPS with ``tiers``. Raises PlacementError if ``max_nodes`` do not."""

    def attempt(nodes: int) -> Optional[Placement]:
        try:
            p = place(model, topo, nodes * topo.ranks_per_node, tiers, policy=policy)
        except PlacementError:
            return None
        return p if p.predicted_qps >= model.target_qps * (1 - 1e-9) else None

    hi, found = 1, attempt(1)
    while found is None:
        if hi >= max_nodes:
            try:  # the reason, from the largest cluster tried
                place(model, topo, max_nodes * topo.ranks_per_node, tiers, policy=policy)
            except PlacementError as e:
                raise PlacementError(f"the model does not fit even {max_nodes:,} nodes: {e}") from None
            raise PlacementError(
                f"the model fits {max_nodes:,} nodes but does not reach {model.target_qps:,.0f} QPS there"
            )
        hi = min(max_nodes, hi * 2)
        found = attempt(hi)
    lo = hi // 2 + 1 if hi > 1 else 1  # attempt(hi // 2) failed (or hi == 1)
    best = (hi, found)
    while lo < best[0]:
        mid = (lo + best[0]) // 2
        p = attempt(mid)
        if p is None:
            lo = mid + 1
        else:
            best = (mid, p)
    return best
