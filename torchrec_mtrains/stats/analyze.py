"""Per-table locality statistics of a trace: lookups, unique rows, pooling factor, reuse
histogram and LRU / LFU hit-rate curves."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from torchrec_mtrains.stats.accesses import step_accesses
from torchrec_mtrains.stats.curves import lfu_curve, lru_curve
from torchrec_mtrains.stats.reuse import reuse_histogram
from torchrec_mtrains.stats.types import TableStats, TableTrace, Trace

__all__ = ["DEFAULT_SAMPLED_ACCESSES", "analyze_table", "analyze_trace"]

DEFAULT_SAMPLED_ACCESSES = 2_000_000
"""Accesses above which ``sample_rate="auto"`` turns on SHARDS, at a rate that keeps about
this many (within 2 points of the exact curve on the Zipf traces of tests/stats/test_stats.py)."""


def analyze_table(name: str, trace: TableTrace, sample_rate: "float | str" = "auto", seed: int = 0) -> TableStats:
    """Statistics of one table's trace.

    Args:
        name: table name (for the result).
        trace: the table's ids per step.
        sample_rate: SHARDS rate of the LRU curve in (0, 1] (1.0: exact), or "auto": exact up
            to ``DEFAULT_SAMPLED_ACCESSES`` accesses, sampled to about that many above.
        seed: salt of the sampling hash.
    """
    acc, acc_offsets = step_accesses(trace)
    rate = _rate(sample_rate, acc.size)
    lookups = int(trace.ids.size)
    samples = int(trace.samples.sum())
    return TableStats(
        name=name,
        num_rows=trace.num_rows,
        steps=trace.num_steps,
        samples=samples,
        lookups=lookups,
        unique_rows=int(np.unique(acc).size),
        step_unique_rows=int(acc.size),
        pooling_factor=lookups / samples if samples else 0.0,
        reuse=reuse_histogram(trace.ids),
        lru=lru_curve(acc, acc_offsets, rate, seed),
        lfu=lfu_curve(acc),
    )


def analyze_trace(trace: Trace, sample_rate: "float | str" = "auto", seed: int = 0) -> Dict[str, TableStats]:
    """``analyze_table`` for every table of ``trace``, keyed by table name."""
    return {name: analyze_table(name, t, sample_rate, seed) for name, t in trace.tables.items()}


def _rate(sample_rate: "float | str", accesses: int) -> float:
    if sample_rate == "auto":
        return min(1.0, DEFAULT_SAMPLED_ACCESSES / accesses) if accesses else 1.0
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r} must be in (0, 1] or 'auto'")
    return float(sample_rate)
