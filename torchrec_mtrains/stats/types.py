"""Value types of trace analysis: traces, reuse histograms, hit-rate curves, table stats.

Trace semantics follow the kernel (``TieredEmbeddingBags``): a training step is one batch;
the row cache sees each step's *distinct* rows once (duplicates within a step are one
access), and a hit is a distinct row of a step that was cached before the step. Hit rate is
hits / (distinct rows per step, summed), as ``cache_stats()['hit_rate']``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = [
    "REUSE_BIN_EDGES",
    "REUSE_BIN_EDGES_16",
    "HitRateCurve",
    "ReuseHistogram",
    "TableStats",
    "TableTrace",
    "Trace",
]

REUSE_BIN_EDGES: Tuple[float, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                      32768, float("inf"))
"""Reuse-count bins (lo, hi] of Meta's dlrm_datasets locality stats: (0,1], (1,2], (2,4], ...,
(8K,16K], (16K,32K], 32K+ (17 bins)."""

REUSE_BIN_EDGES_16: Tuple[float, ...] = REUSE_BIN_EDGES[:-2] + (float("inf"),)
"""The same bins with the last two merged, (0,1] .. (8K,16K], 16K+ (16 bins): the form of
16-value histograms written before the 32K+ bin was split off."""


@dataclass(frozen=True)
class TableTrace:
    """One table's ids over a sequence of steps.

    Attributes:
        ids: int64 [n] row ids of every step, step after step (raw lookups, duplicates kept).
        step_offsets: int64 [steps + 1]; step s holds ``ids[step_offsets[s]:step_offsets[s+1]]``.
        samples: int64 [steps], samples (batch size) of each step (for the pooling factor).
        num_rows: rows of the table if known (for cache sizes as a share of the table).
    """

    ids: np.ndarray
    step_offsets: np.ndarray
    samples: np.ndarray
    num_rows: Optional[int] = None

    @property
    def num_steps(self) -> int:
        """Steps (batches) in the trace."""
        return int(self.step_offsets.size - 1)


@dataclass(frozen=True)
class Trace:
    """Per-table traces over the same steps, keyed by table name."""

    tables: Dict[str, TableTrace] = field(default_factory=dict)


@dataclass(frozen=True)
class ReuseHistogram:
    """Two views of the reuse counts (raw lookups of a row over the trace), in the same bins:
    how the unique rows spread over the bins, and how the lookups do (each lookup counted in
    the bin of the row it goes to; dlrm_datasets' README publishes this one as its "Reuse
    pattern"). Hot rows are few but take most lookups, so the two differ widely.

    Attributes:
        edges: bin edges; bin i is ``(edges[i], edges[i+1]]`` (the last is open: 32K+).
        row_shares: float [bins], share of unique rows by reuse bin, summing to 1 (all zero
            for an empty trace).
        lookup_shares: float [bins], share of lookups by the reuse bin of their row, summing
            to 1 (all zero for an empty trace).
        rows: unique rows counted.
        lookups: lookups counted.
    """

    edges: Tuple[float, ...]
    row_shares: np.ndarray
    lookup_shares: np.ndarray
    rows: int
    lookups: int

    @property
    def shares(self) -> np.ndarray:
        """``row_shares`` under its earlier name (share of unique rows by reuse bin)."""
        return self.row_shares

    def labels(self) -> Tuple[str, ...]:
        """Bin names as in dlrm_datasets: "(0, 1]" ... "(16384, 32768]", "32768+"."""
        out = [f"({int(lo)}, {int(hi)}]" for lo, hi in zip(self.edges[:-2], self.edges[1:-1])]
        return tuple(out + [f"{int(self.edges[-2])}+"])


@dataclass(frozen=True)
class HitRateCurve:
    """Hit rate of a cache of each size on a trace (1 - the miss-ratio curve).

    ``hit_rate(c)`` is ``hits[k] / accesses`` for the largest ``cache_rows[k] <= c``: a step
    function exact at every size (for a sampled curve, an estimate).

    Attributes:
        policy: "lru" or "lfu".
        cache_rows: float [k] ascending cache sizes (rows) where the hit count changes.
        hits: float [k] accesses that hit in a cache of ``cache_rows[k]`` rows.
        accesses: accesses (distinct rows per step, summed) the curve is over.
        sample_rate: SHARDS spatial sampling rate (1.0: exact).
        method: how it was computed, e.g. "stack-distance", "shards", "perfect-lfu".
    """

    policy: str
    cache_rows: np.ndarray
    hits: np.ndarray
    accesses: float
    sample_rate: float = 1.0
    method: str = "stack-distance"

    def hit_rate(self, cache_rows: "float | np.ndarray") -> "float | np.ndarray":
        """Hit rate (0..1) of a cache of ``cache_rows`` rows (scalar or array)."""
        c = np.asarray(cache_rows, dtype=np.float64)
        if np.any(c < 0) or np.any(~np.isfinite(c)):
            raise ValueError(f"cache_rows={cache_rows!r} must be finite and >= 0")
        if self.accesses <= 0 or self.hits.size == 0:  # no accesses, or none ever hit (one cold step)
            out = np.zeros_like(c)
        else:
            k = np.searchsorted(self.cache_rows, c, side="right") - 1
            got = np.where(k >= 0, self.hits[np.maximum(k, 0)], 0.0)
            out = np.clip(got / self.accesses, 0.0, 1.0)
        return float(out) if out.ndim == 0 else out

    def miss_rate(self, cache_rows: "float | np.ndarray") -> "float | np.ndarray":
        """1 - ``hit_rate(cache_rows)``."""
        return 1.0 - self.hit_rate(cache_rows)


@dataclass(frozen=True)
class TableStats:
    """Locality statistics of one table's trace.

    Attributes:
        name: table name.
        num_rows: rows of the table (None if unknown: then the largest id + 1 is used
            where a table size is needed).
        steps: steps in the trace.
        samples: samples over all steps.
        lookups: ids looked up (raw, duplicates kept).
        unique_rows: distinct rows over the whole trace.
        step_unique_rows: distinct rows per step, summed: the cache's accesses.
        pooling_factor: mean ids per sample (lookups / samples, the table's features summed).
        reuse: share of unique rows and share of lookups by reuse count.
        lru: LRU hit-rate curve (exact or SHARDS-sampled).
        lfu: perfect-LFU hit-rate curve.
    """

    name: str
    num_rows: Optional[int]
    steps: int
    samples: int
    lookups: int
    unique_rows: int
    step_unique_rows: int
    pooling_factor: float
    reuse: ReuseHistogram
    lru: HitRateCurve
    lfu: HitRateCurve

    @property
    def table_rows(self) -> int:
        """``num_rows``, or the number of unique rows when the size is unknown."""
        return int(self.num_rows) if self.num_rows else max(1, self.unique_rows)

    @property
    def unique_rows_per_step(self) -> float:
        """Mean distinct rows per step (TorchRec's ``expected_lookups``)."""
        return self.step_unique_rows / self.steps if self.steps else 0.0
