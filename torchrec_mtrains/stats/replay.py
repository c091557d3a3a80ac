"""Replays a table trace on the kernel's real row-cache index (csrc/cache,
``torch.classes.mtrains.SetAssociativeCache``), to check a curve against the cache itself."""

from __future__ import annotations

import torch

from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.stats.types import TableTrace

__all__ = ["replay_cache_hit_rate"]


def replay_cache_hit_rate(trace: TableTrace, cache_rows: int, policy: str = "lru", ways: int = 32) -> float:
    """Hit rate of the kernel's set-associative cache of ``cache_rows`` slots on ``trace``.

    Each step is planned as ``TieredEmbeddingBags`` plans it without a prefetch in flight
    (only the step's own rows locked); the hit rate is ``hits / unique_rows`` of the cache's
    counters, as ``cache_stats()['hit_rate']``.
    """
    load_extension()
    cache = torch.classes.mtrains.SetAssociativeCache(int(cache_rows), int(ways), policy)
    ids = torch.from_numpy(trace.ids)
    bounds = trace.step_offsets.tolist()
    for step, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        cache.plan(ids[lo:hi].contiguous(), step, step, False)
    c = cache.counters()
    return c["hits"] / c["unique_rows"] if c["unique_rows"] else 0.0
