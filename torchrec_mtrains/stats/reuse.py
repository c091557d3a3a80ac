"""Reuse histogram: share of unique rows by reuse count, in dlrm_datasets' bins."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from torchrec_mtrains.stats.types import REUSE_BIN_EDGES, ReuseHistogram

__all__ = ["fit_zipf_alpha", "reuse_counts", "reuse_histogram"]


def reuse_counts(ids: np.ndarray) -> np.ndarray:
    """Lookups of each unique row (int64 [unique rows], in row order)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(ids, return_counts=True)[1].astype(np.int64)


def reuse_histogram(ids: np.ndarray, edges: Optional[Sequence[float]] = None) -> ReuseHistogram:
    """Share of unique rows whose lookup count falls in each bin ``(lo, hi]`` of ``edges``
    (default ``REUSE_BIN_EDGES``: (0,1], (1,2], (2,4], ..., (8K,16K], 16K+)."""
    edges = tuple(REUSE_BIN_EDGES if edges is None else edges)
    counts = reuse_counts(ids)
    bins = np.searchsorted(np.asarray(edges[1:-1], dtype=np.float64), counts, side="left")
    per_bin = np.bincount(bins, minlength=len(edges) - 1).astype(np.float64)
    shares = per_bin / counts.size if counts.size else per_bin
    return ReuseHistogram(edges, shares, int(counts.size))


def fit_zipf_alpha(ids: np.ndarray, min_count: int = 16) -> float:
    """Zipf exponent of a trace: least-squares slope of log(lookups) against log(rank) over
    the rows looked up at least ``min_count`` times (rarer rows are mostly sampling noise).

    Raises:
        ValueError: fewer than 3 rows reach ``min_count``.
    """
    counts = np.sort(reuse_counts(ids))[::-1]
    counts = counts[counts >= min_count]
    if counts.size < 3:
        raise ValueError(f"only {counts.size} rows have >= {min_count} lookups: too few to fit a Zipf exponent")
    x = np.log(np.arange(1, counts.size + 1, dtype=np.float64))
    y = np.log(counts.astype(np.float64))
    slope = np.polyfit(x, y, 1)[0]
    return float(-slope)
