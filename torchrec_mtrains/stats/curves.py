"""Hit-rate curves over cache size: LRU from stack distances (exact or SHARDS), perfect LFU.

LFU: the *perfect LFU* curve, not a simulation. A cache of ``C`` rows that keeps the ``C``
rows accessed in the most steps (frequencies known in advance, each row missing once when
first brought in) hits ``sum over those rows of (steps accessed - 1)``. It gives the whole
curve from one sort (simulating an LFU cache costs one pass per size), and on a long
stationary trace it is what a frequency policy with aging (the kernel's count-min-sketch
LFU, as TinyLFU) tends to. It is an estimate, not a simulation: against the kernel's LFU
cache it reads ~3-5 points high on stationary Zipf traces (the real cache admits every miss
and churns), and it ignores drift: on a trace whose hot rows change it reads low, since it
ranks rows by their frequency over the whole trace. See docs/stats.md.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from torchrec_mtrains.stats.stack_distance import COLD, shards_mask, stack_distances
from torchrec_mtrains.stats.types import HitRateCurve

__all__ = ["lfu_curve", "lru_curve"]


def lru_curve(
    ids: np.ndarray,
    step_offsets: np.ndarray,
    sample_rate: float = 1.0,
    seed: int = 0,
) -> HitRateCurve:
    """LRU hit-rate curve of a step trace.

    Args:
        ids, step_offsets: the cache's accesses (each step's distinct rows, see
            ``step_accesses``).
        sample_rate: 1.0 for the exact curve; below 1, SHARDS with that rate: distances of
            the sampled rows' accesses scaled by ``1 / rate``, with SHARDS-adj's correction
            (the gap between expected and sampled accesses is added to the smallest
            distance, where the hot rows that cause it live).
        seed: salt of the sampling hash.

    Returns:
        The curve; ``accesses`` is the number of accesses of the whole trace.
    """
    total = int(ids.size)
    if sample_rate >= 1.0:
        dist = stack_distances(ids, step_offsets)
        sizes, hits = _cumulate(dist, 1.0)
        return HitRateCurve("lru", sizes, hits, float(total), 1.0, "stack-distance")
    keep = shards_mask(ids, sample_rate, seed)
    step_of = np.repeat(np.arange(step_offsets.size - 1), np.diff(step_offsets))
    sub_ids = ids[keep]
    sub_offsets = np.zeros(step_offsets.size, dtype=np.int64)
    np.cumsum(np.bincount(step_of[keep], minlength=step_offsets.size - 1), out=sub_offsets[1:])
    dist = stack_distances(sub_ids, sub_offsets)
    sizes, hits = _cumulate(dist, sample_rate)
    # Scale hits to the whole trace; SHARDS-adj: expected minus sampled accesses go to the
    # first bucket (clamped so the curve stays non-negative and non-decreasing).
    scale = 1.0 / sample_rate
    hits = hits * scale
    adjust = total - sub_ids.size * scale
    if hits.size:
        hits = np.maximum(hits + adjust, 0.0)
    return HitRateCurve("lru", sizes, hits, float(total), float(sample_rate), "shards")


def lfu_curve(ids: np.ndarray) -> HitRateCurve:
    """Perfect-LFU hit-rate curve (see the module docstring) of the cache's accesses."""
    total = int(ids.size)
    if total == 0:
        return HitRateCurve("lfu", np.zeros(0), np.zeros(0), 0.0, 1.0, "perfect-lfu")
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    gain = counts - 1
    gain = gain[gain > 0]
    sizes = np.arange(1, gain.size + 1, dtype=np.float64)
    return HitRateCurve("lfu", sizes, np.cumsum(gain).astype(np.float64), float(total), 1.0, "perfect-lfu")


def _cumulate(dist: np.ndarray, rate: float) -> Tuple[np.ndarray, np.ndarray]:
    """(sizes, cumulative hits) of the warm accesses' distances, scaled by 1 / rate."""
    warm = dist[dist != COLD]
    if warm.size == 0:
        return np.zeros(0), np.zeros(0)
    values, counts = np.unique(warm, return_counts=True)
    return values.astype(np.float64) / rate, np.cumsum(counts).astype(np.float64)
