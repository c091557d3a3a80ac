"""The look-ahead window a plan gives its tiered tables (``TieredParams.lookahead``).

A window of k batches keeps every row the next k batches use cached while the current one
is planned (docs/kernels.md): it saves the reads of rows those batches would otherwise
read again, and costs the cache slots those rows hold: the rows of k + 2 steps are locked
at once (the step in its backward, the one planned, the k announced). k is the largest
choice whose window rows -- the distinct rows of k + 2 consecutive steps -- fit every SSD
table's cache, so that the window never pushes the cache into its overflow pool (more DRAM)
and every set keeps victims for the policy. The distinct rows of m steps come from the
table's locality curve (Che's approximation): a step adds its distinct rows except those
the m - 1 steps before it touched, the share an LRU cache holding those steps' rows hits.
A DRAM or SCM miss is a memory copy, so only SSD tables ask for a window; a job has one
window (tables of different windows would not share a kernel), so the tightest SSD table
sets it.
"""

from __future__ import annotations

from typing import Iterable, Tuple

from torchrec_mtrains.planner.model.locality import LocalityCurve
from torchrec_mtrains.types import Tier

__all__ = ["LOOKAHEAD_CHOICES", "choose_lookahead", "window_rows"]

LOOKAHEAD_CHOICES = (0, 1, 2, 4, 8, 16, 32)
"""Windows a plan picks from."""


def window_rows(locality: LocalityCurve, steps: int) -> float:
    """Expected distinct rows of ``steps`` consecutive steps of a table."""
    unique = locality.unique_rows_per_step
    rows = unique
    for _ in range(steps - 1):
        rows += unique * (1.0 - locality.hit_rate(rows, "lru"))
    return rows


def choose_lookahead(tables: Iterable[Tuple[Tier, float, LocalityCurve]]) -> int:
    """The window for tiered tables given as (tier, cache rows, locality curve)."""
    ssd = [(cache, locality) for tier, cache, locality in tables if tier is Tier.SSD]
    if not ssd:
        return 0
    return max([0] + [k for k in LOOKAHEAD_CHOICES
                      if all(window_rows(locality, k + 2) <= cache for cache, locality in ssd)])
