"""The look-ahead window a plan gives its tiered tables (``TieredParams.lookahead``).

A window of k batches keeps every row the next k batches use cached while the current one
is planned (docs/kernels.md): it saves the reads of rows those batches would otherwise
read again, and costs the rows it locks. The rows of k + 2 steps are locked at once (the
step in its backward, the one planned, the k announced), so k is the largest choice whose
locked rows -- (k + 2) x the table's distinct rows per step -- take at most
``LOCKED_SHARE`` of every SSD table's cache; the rest stays the policy's. A DRAM or SCM
miss is a memory copy, so only SSD tables ask for a window; a job has one window (tables of
different windows would not share a kernel), so the tightest SSD table sets it.
"""

from __future__ import annotations

from typing import Iterable, Tuple

from torchrec_mtrains.types import Tier

__all__ = ["LOCKED_SHARE", "LOOKAHEAD_CHOICES", "choose_lookahead"]

LOOKAHEAD_CHOICES = (0, 1, 2, 4, 8)
"""Windows a plan picks from (larger ones grow the pipeline's held batches for little more)."""
LOCKED_SHARE = 0.5
"""The most of an SSD table's cache the window's locked rows may take."""


def choose_lookahead(tables: Iterable[Tuple[Tier, float, float]]) -> int:
    """The window for tiered tables given as (tier, cache rows, distinct rows per step)."""
    ssd = [(cache, unique) for tier, cache, unique in tables if tier is Tier.SSD]
    if not ssd:
        return 0
    return max([0] + [k for k in LOOKAHEAD_CHOICES
                      if all((k + 2) * unique <= LOCKED_SHARE * cache for cache, unique in ssd)])
