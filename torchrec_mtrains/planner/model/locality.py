"""Hit-rate curves of a table from a locality model, fast enough for thousands of tables.

A table is modelled as independent steps (IRM): row i is touched by a step with
probability ``q_i = 1 - (1 - p_i)^L`` (``L`` lookups a step, ``p_i`` its popularity). Then
- unique rows per step ``U = sum q_i``;
- LRU (the kernel's cache keeps a step's rows): Che's approximation -- a cache of C rows
  holds what was touched in the last T steps, ``sum_i 1 - (1 - q_i)^T = C``, and row i
  hits with probability ``1 - (1 - q_i)^T``;
- LFU: the static cache of the C most popular rows (what frequency caching tends to on a
  stationary trace), hit rate ``sum_{top C} q_i / U``.
A reuse histogram (share of lookups by reuse count) gives the popularity of the rows it
describes (histogram_locality).
Sums over billions of rows are taken exactly over the first ranks and by the trapezoid
rule on a log-spaced grid of ranks after that (the summands are smooth in the rank).
A measured trace replaces the model: its curves come from torchrec_mtrains.stats.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

import numpy as np

__all__ = ["LocalityCurve", "histogram_locality", "zipf_locality"]

_EXACT_RANKS = 4096
_GRID = 2048
_T_GRID = np.geomspace(1e-3, 1e9, 400)  # steps of history T at which Che's equation is solved
# Below this exponent exp() is under 2**-59, a sixteenth of an ulp of 1: expm1 rounds to exactly -1.
_SATURATED = -41.0
_FEW_ROWS = 512


@dataclasses.dataclass(frozen=True)
class LocalityCurve:
    """Expected hits of a cache of each size, over the rows a step touches."""

    unique_rows_per_step: float
    cache_rows: np.ndarray  # ascending
    lru_hit_rate: np.ndarray
    lfu_hit_rate: np.ndarray

    def _curve(self, policy: str) -> np.ndarray:
        # "tinylfu" (and "lfu") use the static-optimum LFU curve: TinyLFU is a frequency
        # policy and has no curve of its own here; its measured hit rates are close to LFU's.
        return self.lru_hit_rate if policy == "lru" else self.lfu_hit_rate

    def hit_rate(self, cache_rows: float, policy: str = "lru") -> float:
        curve = self._curve(policy)
        if cache_rows <= 0:
            return 0.0
        return float(np.interp(cache_rows, self.cache_rows, curve, left=0.0, right=float(curve[-1])))

    def rows_for_hit_rate(self, target: float, policy: str = "lru") -> Optional[float]:
        """The smallest cache reaching ``target`` (None if no size does)."""
        curve = self._curve(policy)
        if target > curve[-1]:
            return None
        k = int(np.searchsorted(curve, target, side="left"))
        if k == 0:
            return float(self.cache_rows[0])
        lo, hi = curve[k - 1], curve[k]
        frac = 0.0 if hi <= lo else (target - lo) / (hi - lo)
        return float(self.cache_rows[k - 1] + frac * (self.cache_rows[k] - self.cache_rows[k - 1]))


def _rank_grid(n: int) -> Tuple[np.ndarray, np.ndarray]:
    """Ranks and their weights so that ``sum(w * f(r))`` approximates ``sum_{i=1..n} f(i)``."""
    if n <= _EXACT_RANKS + _GRID:
        r = np.arange(1, n + 1, dtype=np.float64)
        return r, np.ones_like(r)
    exact = np.arange(1, _EXACT_RANKS + 1, dtype=np.float64)
    tail = np.geomspace(_EXACT_RANKS + 1, n, _GRID)
    w = np.empty_like(tail)  # trapezoid weights over [EXACT+1, n] (in ranks)
    gaps = np.diff(tail)
    w[0], w[-1] = gaps[0] / 2 + 0.5, gaps[-1] / 2 + 0.5
    w[1:-1] = (gaps[:-1] + gaps[1:]) / 2
    return np.concatenate([exact, tail]), np.concatenate([np.ones_like(exact), w])


def _touched(t_grid: np.ndarray, log1mq: np.ndarray) -> np.ndarray:
    """``-expm1(outer(t_grid, log1mq))`` (t_grid > 0 ascending, log1mq <= 0), bit for bit,
    without taking exp() where it saturates: where ``T * log1mq`` is below ``_SATURATED``
    the row was surely touched (1.0). Those (T, row) pairs are a prefix of each T's rows, as
    log1mq rises with the rank (bounded here by its running maximum), and a longer one the
    larger T: the first Ts saturate no row and the last ones every row."""
    if len(log1mq) < _FEW_ROWS:  # a reuse histogram's bins: a loop over T would cost more than it saves
        return -np.expm1(np.outer(t_grid, log1mq))
    out = np.empty((len(t_grid), len(log1mq)))
    starts = np.searchsorted(np.maximum.accumulate(log1mq), _SATURATED / t_grid)
    none, every = int(np.searchsorted(starts, 0, side="right")), int(np.searchsorted(starts, len(log1mq)))
    head = out[:none]
    np.outer(t_grid[:none], log1mq, out=head)
    np.expm1(head, out=head)
    np.negative(head, out=head)
    for row, t, start in zip(out[none:every], t_grid[none:every], starts[none:every]):
        row[:start] = 1.0
        tail = row[start:]
        np.multiply(t, log1mq[start:], out=tail)
        np.expm1(tail, out=tail)
        np.negative(tail, out=tail)
    out[every:] = 1.0
    return out


def _curves(p: np.ndarray, weights: np.ndarray, num_rows: int, lookups_per_step: float, points: int,
            drift: float = 0.0) -> LocalityCurve:
    """Curves of rows with popularity ``p`` (descending; ``weights[k]`` rows each). With
    ``drift``, each row moves to a fresh id every 1/drift steps on average: the first touch
    of each fresh id misses whatever the cache size."""
    q = -np.expm1(lookups_per_step * np.log1p(-np.minimum(p, 1 - 1e-15)))  # 1 - (1-p)^L
    unique = float(weights @ q)
    if drift > 0:  # share of a row's touches that are first touches of its id of the moment
        first = drift * -np.expm1(np.log1p(-np.minimum(q, 1 - 1e-15)) / drift) / np.maximum(q, 1e-300)
        weights_hit = weights * q * (1.0 - np.minimum(first, 1.0))
    else:
        weights_hit = weights * q
    sizes = np.unique(np.geomspace(1, num_rows, points).round())
    # LFU: the top-C rows by popularity.
    cum_q = np.concatenate([[0.0], np.cumsum(weights_hit)])
    cum_w = np.concatenate([[0.0], np.cumsum(weights)])
    lfu = np.interp(sizes, cum_w, cum_q) / unique
    # LRU (Che): for each T, the cache size it corresponds to and the hit rate it gives.
    log1mq = np.log1p(-np.minimum(q, 1 - 1e-15))
    touched = _touched(_T_GRID, log1mq)  # [T, rows]: touched in the last T steps
    occ = touched @ weights
    hit = touched @ weights_hit / unique
    lru = np.interp(sizes, occ, hit, left=0.0, right=float(hit[-1]))
    lru = np.minimum(np.maximum.accumulate(lru), lfu)  # LRU never beats the static optimum here
    return LocalityCurve(unique, sizes.astype(np.float64), lru, np.maximum.accumulate(lfu))


@functools.lru_cache(maxsize=4096)
def zipf_locality(num_rows: int, lookups_per_step: float, alpha: float, points: int = 64) -> LocalityCurve:
    """The curve of a table whose lookups follow Zipf(alpha) over its rows."""
    if num_rows < 1 or lookups_per_step <= 0 or alpha < 0:
        raise ValueError(f"zipf_locality: num_rows={num_rows}, lookups_per_step={lookups_per_step}, alpha={alpha}")
    ranks, weights = _rank_grid(num_rows)
    p = ranks ** -alpha
    p /= float(weights @ p)
    return _curves(p, weights, num_rows, lookups_per_step, points)


@functools.lru_cache(maxsize=1024)
def histogram_locality(
    num_rows: int, lookups_per_step: float, shares: Tuple[float, ...], trace_steps: float = 1000, points: int = 64,
    drift: float = 0.0,
) -> LocalityCurve:
    """The curve of a table whose lookups spread over reuse counts as a reuse histogram says
    (share of lookups by the reuse bin of their row, dlrm_datasets' 17 bins or the 16 up to
    16K+) over a trace of ``trace_steps`` steps: each bin holds its lookups / its mean reuse
    rows (``torchrec_mtrains.stats.rows_per_bin``, the generator's conversion), those rows
    take the bin's mean reuse and a popularity proportional to it, and rows the trace never
    touches have none. When the bins need more rows than the table has, every bin's rows
    shrink in proportion (their lookup shares stay). ``drift``: the share of the rows that
    move to fresh ids each step (their first touches miss)."""
    from torchrec_mtrains.stats import bin_edges_for, bin_mean_reuse, rows_per_bin

    weights = rows_per_bin(shares, lookups_per_step * trace_steps)  # ValueError names bad shares
    counts = bin_mean_reuse(bin_edges_for(len(shares)))
    weights = weights * min(1.0, num_rows / float(weights.sum()))
    order = np.argsort(-counts)
    counts, weights = counts[order], weights[order]
    keep = weights > 0
    p = counts[keep] / float(weights[keep] @ counts[keep])
    return _curves(p, weights[keep], num_rows, lookups_per_step, points, drift)
