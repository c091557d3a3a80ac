"""TorchRec's ``CacheStatistics`` (what its planner asks of a cached table) from a curve."""

from __future__ import annotations

from typing import Optional

from torchrec.distributed.types import CacheStatistics

from torchrec_mtrains.stats.types import HitRateCurve, TableStats

__all__ = ["CurveCacheStatistics"]


class CurveCacheStatistics(CacheStatistics):
    """``torchrec.distributed.types.CacheStatistics`` answered from a hit-rate curve.

    Args:
        curve: the table's LRU or LFU hit-rate curve.
        num_rows: rows of the table: ``clf`` (cache load factor) is cache rows / num_rows.
        expected_lookups: distinct rows per step (global batch), mean over the trace.
        cacheability: 0 (very cacheable) .. 1 (hard to cache): here the compulsory miss rate,
            unique rows of the trace / accesses (distinct rows per step, summed) -- the miss
            rate of an unbounded cache, independent of cache size.
    """

    def __init__(self, curve: HitRateCurve, num_rows: int, expected_lookups: float, cacheability: float) -> None:
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
            raise ValueError(f"num_rows={num_rows!r} must be a positive integer")
        if not 0.0 <= cacheability <= 1.0:
            raise ValueError(f"cacheability={cacheability!r} must be in [0, 1]")
        if expected_lookups < 0:
            raise ValueError(f"expected_lookups={expected_lookups!r} must be >= 0")
        self._curve = curve
        self._num_rows = num_rows
        self._expected_lookups = float(expected_lookups)
        self._cacheability = float(cacheability)

    @classmethod
    def from_table_stats(cls, stats: TableStats, policy: str = "lru") -> "CurveCacheStatistics":
        """From ``analyze_table``'s result, with its ``policy`` ("lru" or "lfu") curve."""
        if policy not in ("lru", "lfu"):
            raise ValueError(f"policy={policy!r} must be 'lru' or 'lfu'")
        curve = stats.lru if policy == "lru" else stats.lfu
        accesses = stats.step_unique_rows
        cacheability = stats.unique_rows / accesses if accesses else 1.0
        return cls(curve, stats.table_rows, stats.unique_rows_per_step, cacheability)

    @property
    def expected_lookups(self) -> float:
        """Distinct rows per training step (global batch)."""
        return self._expected_lookups

    def expected_miss_rate(self, clf: float) -> float:
        """Miss rate of a cache of ``clf * num_rows`` rows: 1.0 at clf 0, 0.0 at clf >= 1
        (the whole table resident, as TorchRec's contract says), the curve in between."""
        if not 0.0 <= clf:
            raise ValueError(f"clf={clf!r} must be >= 0")
        if clf >= 1.0:
            return 0.0
        if clf == 0.0:
            return 1.0
        return float(self._curve.miss_rate(clf * self._num_rows))

    @property
    def cacheability(self) -> float:
        """Compulsory miss rate: 0 very cacheable, 1 no reuse at all."""
        return self._cacheability
