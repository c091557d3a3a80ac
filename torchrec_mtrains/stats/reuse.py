"""Reuse histograms in dlrm_datasets' bins: measured from a trace (share of unique rows and
share of lookups by reuse count), and a histogram of lookup shares turned into the unique
rows each bin holds -- the one conversion the generator and the planner's locality model
share.

A row of bin (lo, hi] is given a reuse count drawn log-uniformly in the bin: ``ceil(e^u)``,
u uniform on (ln max(lo, 1), ln hi], so counts are integers in (lo, hi]; the open last bin
is drawn from (lo, 2 lo]. ``bin_mean_reuse`` is the exact mean of that draw, the
representative reuse of the bin: rows in a bin = lookups in the bin / its mean reuse.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import numpy as np

from torchrec_mtrains.stats.types import REUSE_BIN_EDGES, REUSE_BIN_EDGES_16, ReuseHistogram

__all__ = [
    "bin_edges_for",
    "bin_mean_reuse",
    "check_reuse_shares",
    "draw_reuse_counts",
    "fit_zipf_alpha",
    "lookups_per_unique_row",
    "reuse_counts",
    "reuse_histogram",
    "rows_per_bin",
]

_OPEN_BIN_RATIO = 2.0  # the open last bin (lo+) is drawn from (lo, 2 lo]


def bin_edges_for(bins: int) -> Tuple[float, ...]:
    """The bin edges of a histogram of ``bins`` values: 17 -> ``REUSE_BIN_EDGES`` (last bin
    32K+), 16 -> ``REUSE_BIN_EDGES_16`` (last bin 16K+).

    Raises:
        ValueError: any other number of bins.
    """
    for edges in (REUSE_BIN_EDGES, REUSE_BIN_EDGES_16):
        if bins == len(edges) - 1:
            return edges
    raise ValueError(f"a reuse histogram has {len(REUSE_BIN_EDGES) - 1} or {len(REUSE_BIN_EDGES_16) - 1} bins, "
                     f"got {bins}")


def check_reuse_shares(shares: Sequence[float], what: str = "reuse_histogram") -> np.ndarray:
    """``shares`` as float64 normalised to sum 1, after checking them.

    Raises:
        ValueError: naming ``what``: not 16 or 17 values, a negative or non-finite value, or
            a zero sum.
    """
    try:
        a = np.asarray(shares, dtype=np.float64)
    except (TypeError, ValueError):
        a = np.zeros(0)
    if (a.ndim != 1 or a.size not in (len(REUSE_BIN_EDGES) - 1, len(REUSE_BIN_EDGES_16) - 1)
            or not np.all(np.isfinite(a)) or np.any(a < 0) or not a.sum() > 0):
        raise ValueError(f"{what} must be {len(REUSE_BIN_EDGES_16) - 1} shares (bins (0,1] .. 16K+) or "
                         f"{len(REUSE_BIN_EDGES) - 1} (.. 32K+), each >= 0, with a positive sum, got {shares!r}")
    return a / a.sum()


def _bounds(edges: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """Lowest and highest count of each bin's draw, (lo, hi] with lo >= 1 and hi finite."""
    lo = np.maximum(np.asarray(edges[:-1], dtype=np.float64), 1.0)
    hi = np.asarray(edges[1:], dtype=np.float64).copy()
    hi[-1] = lo[-1] * _OPEN_BIN_RATIO
    return lo, hi


@functools.lru_cache(maxsize=8)
def _mean_reuse(edges: Tuple[float, ...]) -> Tuple[float, ...]:
    lo, hi = _bounds(edges)
    out = []
    for a, b in zip(lo.astype(np.int64), hi.astype(np.int64)):
        if b <= a:  # (0, 1]: every row is looked up once
            out.append(float(b))
            continue
        k = np.arange(a + 1, b + 1, dtype=np.float64)  # P(count = k) = ln(k / (k-1)) / ln(b / a)
        out.append(float(k @ np.log(k / (k - 1)) / np.log(b / a)))
    return tuple(out)


def bin_mean_reuse(edges: Sequence[float] = REUSE_BIN_EDGES) -> np.ndarray:
    """Mean reuse count of a row of each bin under ``draw_reuse_counts`` (float [bins])."""
    return np.asarray(_mean_reuse(tuple(float(e) for e in edges)))


def draw_reuse_counts(rng: np.random.Generator, bins: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """A reuse count (int64) for a row of each bin index in ``bins``, log-uniform in the bin."""
    lo, hi = _bounds(edges)
    llo, lhi = np.log(lo), np.log(hi)
    u = rng.random(bins.size)
    counts = np.ceil(np.exp(llo[bins] + u * (lhi[bins] - llo[bins]))).astype(np.int64)
    return np.clip(counts, np.minimum(lo[bins] + 1, hi[bins]).astype(np.int64), hi[bins].astype(np.int64))


def rows_per_bin(lookup_shares: Sequence[float], lookups: float) -> np.ndarray:
    """Unique rows (float, expected) each bin holds when ``lookups`` lookups spread over the
    bins as ``lookup_shares`` says (16 or 17 values; normalised): lookups in the bin / its
    mean reuse.

    Raises:
        ValueError: bad shares (see ``check_reuse_shares``) or ``lookups`` < 0.
    """
    shares = check_reuse_shares(lookup_shares)
    if not lookups >= 0:
        raise ValueError(f"lookups={lookups!r} must be >= 0")
    return float(lookups) * shares / bin_mean_reuse(bin_edges_for(shares.size))


def lookups_per_unique_row(lookup_shares: Sequence[float]) -> float:
    """Mean lookups of a unique row for a histogram of lookup shares (6.94 for dlrm_datasets',
    which publishes 6.9)."""
    return 1.0 / float(rows_per_bin(lookup_shares, 1.0).sum())


def reuse_counts(ids: np.ndarray) -> np.ndarray:
    """Lookups of each unique row (int64 [unique rows], in row order)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(ids, return_counts=True)[1].astype(np.int64)


def reuse_histogram(ids: np.ndarray, edges: Optional[Sequence[float]] = None) -> ReuseHistogram:
    """Share of unique rows and share of lookups by the reuse count of the row, in the bins
    ``(lo, hi]`` of ``edges`` (default ``REUSE_BIN_EDGES``: (0,1], (1,2], ..., (16K,32K], 32K+)."""
    edges = tuple(REUSE_BIN_EDGES if edges is None else edges)
    counts = reuse_counts(ids)
    bins = np.searchsorted(np.asarray(edges[1:-1], dtype=np.float64), counts, side="left")
    rows = np.bincount(bins, minlength=len(edges) - 1).astype(np.float64)
    looked = np.bincount(bins, weights=counts.astype(np.float64), minlength=len(edges) - 1)
    total = int(counts.sum())
    return ReuseHistogram(edges, rows / counts.size if counts.size else rows, looked / total if total else looked,
                          int(counts.size), total)


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
