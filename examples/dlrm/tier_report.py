"""What the tiers hold and moved, for metrics.json: per tiered shard, its backing store's
counters (rows materialised on the tier, device I/O) and its cache's, gathered from every
rank; the process's memory (VmRSS, VmHWM, RssAnon, RssFile from /proc/self/status); and per
rank its median step and the rows its tiers read (how evenly the ranks share the work).

``materialised_bytes`` counts the rows written to a tier (the block store's live rows, the
SCM store's written rows), the bytes the tier holds for the model, as opposed to the
tables' logical size (rows never written are initialised lazily and take no space)."""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence

import torch.distributed as dist

__all__ = ["max_over_mean", "memory_status", "rows_read_per_rank", "tier_counters"]

_STORE_KEYS = ("live_rows", "rows_written", "rows_read", "disk_rows_read", "lazy_init_rows", "device_reads",
               "device_writes", "device_bytes_read", "device_bytes_written", "gc_rows_moved", "write_amplification",
               "rows_materialised", "dram_bytes_per_row")
# A virtual table's id index (cache_stats keys of its shards): live ids, bytes, evictions.
_VIRTUAL_KEYS = ("live_ids", "capacity", "index_bytes", "metadata_bytes", "index_bytes_per_live_id",
                 "index_bytes_per_row_used", "ids_created", "ids_evicted", "eviction_passes")
_CACHE_KEYS = ("hits", "misses", "unique_rows", "lookups", "rows_loaded", "rows_written_back", "cache_capacity_rows",
               "plan_seconds", "tier_seconds", "prefetch_wait_seconds", "steps_prefetched")


def memory_status() -> Dict[str, int]:
    """This process's VmRSS, VmHWM (peak RSS), RssAnon and RssFile in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _local_counters(dmp) -> Dict[str, Dict[str, float]]:
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    out: Dict[str, Dict[str, float]] = {}
    for m in dmp.modules():
        if not isinstance(m, ShardedTieredEmbeddingBagCollection):
            continue
        for kernel in m.tiered_kernels():
            emb = kernel.emb_module
            caches = emb.cache_stats()
            for t, name in enumerate(emb.table_names):
                store = emb.store_stats(t)
                row_bytes = emb.layouts[t].row_bytes
                entry = {"tier": emb.tiers[t].name, "row_bytes": float(row_bytes),
                         **{f"store_{k}": float(store[k]) for k in _STORE_KEYS if k in store},
                         **{f"cache_{k}": float(caches[name][k]) for k in _CACHE_KEYS if k in caches[name]},
                         **{f"virtual_{k}": float(caches[name][k]) for k in _VIRTUAL_KEYS if k in caches[name]}}
                materialised = store.get("live_rows", store.get("rows_materialised"))
                entry["materialised_bytes"] = float(materialised) * row_bytes if materialised is not None else 0.0
                out[name] = entry
    return out


def _rank_summary(shards: Dict[str, Dict[str, float]], step_times: Optional[Sequence[float]]) -> Dict[str, float]:
    """This rank's median step seconds (nan without two steps), the rows its tiers returned
    (``tier_rows_read``), how many of them were first touches (``tier_first_touches``: made
    in place, never read) and its tiers' device reads."""
    steps = [b - a for a, b in zip(step_times or [], (step_times or [])[1:])]
    return {"step_seconds_median": statistics.median(steps) if steps else float("nan"),
            "tier_rows_read": sum(s.get("store_rows_read", 0.0) for s in shards.values()),
            "tier_first_touches": sum(s.get("store_lazy_init_rows", 0.0) for s in shards.values()),
            "tier_device_reads": sum(s.get("store_device_reads", 0.0) for s in shards.values())}


def rows_read_per_rank(ranks: Sequence[Dict[str, float]]) -> List[float]:
    """Each rank's rows read from its tiers (``tiers.ranks`` of metrics.json): the rows its
    tiers returned less their first touches, which no tier reads (a row never written is
    initialised in place)."""
    return [r["tier_rows_read"] - r.get("tier_first_touches", 0.0) for r in ranks]


def max_over_mean(values: Sequence[float]) -> float:
    """How unevenly the ranks share a load: its largest over its mean (nan without any)."""
    total = sum(values)
    return max(values) / (total / len(values)) if values and total > 0 else float("nan")


def tier_counters(dmp, step_times: Optional[Sequence[float]] = None) -> Dict[str, object]:
    """Every rank's shards' counters and memory (a collective); on every rank:
    ``{"shards": {shard: counters and its "rank"}, "memory": [per rank], "materialised_bytes": {tier: bytes},
    "ranks": [per rank: median step seconds of ``step_times`` (its clock at each step), rows
    and device reads of its tiers]}``."""
    local = _local_counters(dmp)
    mine = {"shards": local, "memory": memory_status(), "rank": _rank_summary(local, step_times)}
    gathered: List[Dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    shards: Dict[str, Dict[str, float]] = {}
    for rank, g in enumerate(gathered):
        shards.update({name: {**c, "rank": rank} for name, c in g["shards"].items()})
    by_tier: Dict[str, float] = {}
    for s in shards.values():
        by_tier[s["tier"]] = by_tier.get(s["tier"], 0.0) + s["materialised_bytes"]
    return {"shards": shards, "memory": [g["memory"] for g in gathered], "materialised_bytes": by_tier,
            "ranks": [g["rank"] for g in gathered]}
