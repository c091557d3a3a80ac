"""How many nodes a model needs: the fewest whose placement meets the target QPS, with all
the node's tiers and with HBM + DRAM only (``plan_report``, what ``mtrains plan`` shows)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from torchrec_mtrains.planner.model.model_spec import ModelSpec
from torchrec_mtrains.planner.model.placement import Placement, PlacementError, PlacementMemo, place
from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["plan_report", "size_cluster"]


def size_cluster(
    model: ModelSpec,
    topo: TieredTopology,
    tiers: Optional[Sequence[Tier]] = None,
    max_nodes: int = 100_000,
    policy: str = "lru",
) -> Tuple[int, Placement]:
    """(nodes, placement) of the fewest nodes of ``topo`` that hold ``model`` and meet its
    target QPS with ``tiers``. Raises PlacementError if ``max_nodes`` do not."""
    memo = PlacementMemo(model, topo, policy)  # what does not depend on the size, for every size tried

    def attempt(nodes: int) -> Optional[Placement]:
        try:
            p = place(model, topo, nodes * topo.ranks_per_node, tiers, policy=policy, memo=memo)
        except PlacementError:
            return None
        return p if p.predicted_qps >= model.target_qps * (1 - 1e-9) else None

    hi, found = 1, attempt(1)
    while found is None:
        if hi >= max_nodes:
            try:  # the reason, from the largest cluster tried
                place(model, topo, max_nodes * topo.ranks_per_node, tiers, policy=policy, memo=memo)
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


def plan_report(model: ModelSpec, topo: TieredTopology, max_nodes: int, policy: str = "lru") -> Dict[str, Any]:
    """The report of ``mtrains plan`` (plain types, JSON-ready): the fewest nodes of ``topo``
    for ``model`` with all its tiers and with HBM + DRAM only, the predicted QPS of each,
    bytes per tier per node, and each table's tier, cache rows and predicted hit rate.

    Args:
        model: the model, with its target QPS.
        topo: the node type.
        max_nodes: the largest cluster to consider.
        policy: cache policy of the predictions, "lru", "lfu" or "tinylfu" (LFU's curve).

    Raises:
        PlacementError: ``max_nodes`` nodes do not hold the model with all tiers (with HBM +
            DRAM only, the report gives the reason as ``hbm_ddr_only_error``).
    """
    nodes, placement = size_cluster(model, topo, max_nodes=max_nodes, policy=policy)
    baseline_tiers = [t for t in (Tier.HBM, Tier.DRAM) if t in topo.tiers]
    try:
        base_nodes, base = size_cluster(model, topo, tiers=baseline_tiers, max_nodes=max_nodes, policy=policy)
    except PlacementError as e:
        base_nodes, base = None, None
        base_error = str(e)
    by_name = {t.name: t for t in model.tables}
    tables = []
    for name, where in placement.tables.items():
        t = by_name[name]
        tables.append({
            "name": name, "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim,
            "bytes": t.bytes, "tier": where.tier.name, "cache_rows": where.cache_rows,
            "hit_rate": round(where.hit_rate, 4), "bandwidth_bytes_per_s": where.bandwidth_bytes_per_s,
            "unique_rows_per_step": t.locality.unique_rows_per_step,
        })
    report: Dict[str, Any] = {
        "hardware": topo.name,
        "batch_size": model.batch_size,
        "target_qps": model.target_qps,
        "embedding_bytes": model.embedding_bytes,
        "nodes": nodes,
        "ranks": nodes * topo.ranks_per_node,
        "nodes_hbm_ddr_only": base_nodes,
        "node_ratio": (base_nodes / nodes) if base_nodes else None,
        "predicted_qps": placement.predicted_qps,
        "predicted_qps_hbm_ddr_only": base.predicted_qps if base else None,
        "tier_use_per_node": _tier_use(placement, nodes),
        "tables": tables,
    }
    if base is None:
        report["hbm_ddr_only_error"] = base_error
    return report


def _tier_use(p: Placement, nodes: int) -> Dict[str, Dict[str, float]]:
    return {
        t.name: {"used_bytes": p.used_bytes.get(t, 0.0) / nodes, "capacity_bytes": p.capacity_bytes[t] / nodes}
        for t in p.capacity_bytes
    }
