"""Synthetic traces in dlrm_datasets' format, calibrated to a Zipf exponent or to a reuse
histogram (such as dlrm_datasets' published one), deterministic for (seed, step).

- Zipf(alpha) table: ``B * pooling_factor`` ids drawn independently with
  P(rank k) proportional to k^-alpha over the table's rows, ranks mapped to rows by a random
  permutation (so hot rows are spread over the table, as hashed ids are).
- Reuse-histogram table: the histogram is the share of *lookups* by the reuse count of the
  row they go to (dlrm_datasets' "Reuse pattern"). ``B * pooling_factor`` lookups spread
  over the bins by those shares; each bin holds lookups / its mean reuse unique rows
  (``stats.reuse.rows_per_bin``, largest remainder rounding), a row's lookup count is drawn
  log-uniformly inside its bin (lo, hi] (the open last bin: (lo, 2 lo]), and the ids are
  shuffled over the batch. The histogram is reproduced up to sampling noise and the rounding
  of each bin's rows; the pooling factor only approximately (the lookups are what the
  counts add up to).
- Drift (reuse-histogram tables): the rows ranked by lookup count keep their counts from step
  to step, but each step a share ``drift`` of the ranks moves to a fresh id, as new ids arrive
  in real traffic. Rank r is on its generation ``g = floor(step * drift + phase_r)`` (phase_r
  uniform in [0, 1), fixed per seed), and generation g of rank r is row
  ``pool[(g * U + r) mod num_rows]`` (``U`` ranks, ``pool`` a permutation of the rows): fresh
  until the table's rows run out, after which ids retired long ago return. Fresh ids can
  coincide with live ones only when the table has fewer than twice ``U`` rows.

Steps: the rank -> count layout, the Zipf permutation and the drift phases depend on the
seed only; ``step`` draws the shuffle, the Zipf ids and the lengths, and moves the drift.
Lengths: the table's lookups spread over the B samples multinomially (mean = pooling factor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from torchrec_mtrains.stats.dlrm_trace import DlrmBatch, check_dlrm_batch
from torchrec_mtrains.stats.reuse import bin_edges_for, check_reuse_shares, draw_reuse_counts, rows_per_bin

__all__ = [
    "DLRM_DATASETS_LOOKUP_SHARES",
    "DLRM_DATASETS_REUSE",
    "DLRM_DATASETS_ROW_SHARES",
    "SyntheticTable",
    "drifted_ids",
    "drifted_positions",
    "generate_dlrm_batch",
    "zipf_ids",
]

DLRM_DATASETS_LOOKUP_SHARES: Tuple[float, ...] = (
    0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048, 0.048, 0.043, 0.031,
    0.023, 0.019)
"""Share of lookups by the reuse count of their row in Meta's dlrm_datasets (README, "Reuse
pattern"; first file, 856 tables, one batch of 65,536 samples), in the 17 bins of
``REUSE_BIN_EDGES``: (0,1] .. (16K,32K], 32K+. 6.9 lookups per unique row."""

DLRM_DATASETS_ROW_SHARES: Tuple[float, ...] = (
    0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""Share of unique rows by reuse count in the same batch (locality_stats.txt), in the bins of
``REUSE_BIN_EDGES``; the bins above 512 are published as under 0.0005 each (0 here). The
generator, given ``DLRM_DATASETS_LOOKUP_SHARES``, yields close to these."""

DLRM_DATASETS_REUSE: Tuple[float, ...] = DLRM_DATASETS_LOOKUP_SHARES
"""``DLRM_DATASETS_LOOKUP_SHARES`` under its earlier name."""


@dataclass(frozen=True)
class SyntheticTable:
    """One synthetic table: give exactly one of ``zipf_alpha`` and ``reuse_histogram``.

    Attributes:
        num_rows: rows of the table.
        pooling_factor: mean ids per sample.
        zipf_alpha: Zipf exponent (> 0).
        reuse_histogram: share of lookups by the reuse count of their row, per bin of
            ``REUSE_BIN_EDGES`` (17 values, to 32K+) or ``REUSE_BIN_EDGES_16`` (16, to 16K+),
            normalised to sum 1.
        drift: share of the popular ranks moved to fresh ids per step, in [0, 1); needs
            ``reuse_histogram`` (a Zipf table's ranks cover all its rows: no id is fresh).
            A drifting table's generator holds a permutation of its rows (8 bytes a row).
    """

    num_rows: int
    pooling_factor: float
    zipf_alpha: Optional[float] = None
    reuse_histogram: Optional[Sequence[float]] = None
    drift: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.num_rows, bool) or not isinstance(self.num_rows, int) or self.num_rows < 1:
            raise ValueError(f"num_rows={self.num_rows!r} must be a positive integer")
        if not isinstance(self.pooling_factor, (int, float)) or not self.pooling_factor > 0:
            raise ValueError(f"pooling_factor={self.pooling_factor!r} must be > 0")
        if (self.zipf_alpha is None) == (self.reuse_histogram is None):
            raise ValueError("give exactly one of zipf_alpha and reuse_histogram")
        if self.zipf_alpha is not None and not (isinstance(self.zipf_alpha, (int, float)) and self.zipf_alpha > 0):
            raise ValueError(f"zipf_alpha={self.zipf_alpha!r} must be > 0")
        if self.reuse_histogram is not None:
            check_reuse_shares(self.reuse_histogram)
        if isinstance(self.drift, bool) or not isinstance(self.drift, (int, float)) or not 0 <= self.drift < 1:
            raise ValueError(f"drift={self.drift!r} must be a number in [0, 1)")
        if self.drift and self.reuse_histogram is None:
            raise ValueError(f"drift={self.drift!r} needs reuse_histogram: a Zipf table's ranks cover all its rows")


def drifted_positions(phase: np.ndarray, drift: float, step: int, ranks: np.ndarray, pool_size: int) -> np.ndarray:
    """Positions in the pool of ``ranks`` at ``step``: ``(g * U + r) mod pool_size``,
    ``g = floor(step * drift + phase[r])``, U = ``phase.size`` (see the module docstring)."""
    gen = np.floor(step * float(drift) + phase[ranks]).astype(np.int64)
    return (gen * phase.size + ranks) % pool_size


def drifted_ids(pool: np.ndarray, phase: np.ndarray, drift: float, step: int,
                ranks: Optional[np.ndarray] = None) -> np.ndarray:
    """Ids of ``ranks`` (default: all ``phase.size`` ranks) at ``step``: rank r is row
    ``pool[drifted_positions(...)]``. ``drift`` 0 gives ``pool[r]`` at every step."""
    r = np.arange(phase.size, dtype=np.int64) if ranks is None else np.asarray(ranks, dtype=np.int64)
    if not drift:
        return pool[r]
    return pool[drifted_positions(phase, drift, step, r, pool.size)]


def _zipf_ranks(rng: np.random.Generator, num_rows: int, count: int, alpha: float) -> np.ndarray:
    """``count`` ranks (0-based) drawn with P(rank k) proportional to (k + 1)^-alpha."""
    p = np.arange(1, num_rows + 1, dtype=np.float64) ** -float(alpha)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(count), side="right"), num_rows - 1)


def zipf_ids(rng: np.random.Generator, num_rows: int, count: int, alpha: float) -> np.ndarray:
    """``count`` ids of Zipf(alpha) ranks over ``num_rows`` rows, ranks mapped to rows by a
    random permutation."""
    ranks = _zipf_ranks(rng, num_rows, count, alpha)
    return rng.permutation(num_rows).astype(np.int64)[ranks]


def _bin_counts(shares: np.ndarray, unique: int) -> np.ndarray:
    """Rows per bin summing to ``unique`` (largest remainder)."""
    exact = shares * unique
    out = np.floor(exact).astype(np.int64)
    rest = unique - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


def _histogram_layout(rng: np.random.Generator, table: SyntheticTable,
                      lookups: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lookup count of each rank, descending; pool of row ids; drift phase of each rank)."""
    shares = check_reuse_shares(table.reuse_histogram)
    expected = rows_per_bin(shares, lookups)
    unique = max(1, int(round(float(expected.sum()))))
    if unique > table.num_rows:
        raise ValueError(f"reuse_histogram with pooling_factor={table.pooling_factor} needs {unique} unique rows, "
                         f"more than num_rows={table.num_rows}")
    bins = np.repeat(np.arange(shares.size), _bin_counts(expected / expected.sum(), unique))
    counts = np.sort(draw_reuse_counts(rng, bins, bin_edges_for(shares.size)))[::-1]
    if not table.drift:
        return counts, rng.choice(table.num_rows, size=unique, replace=False).astype(np.int64), np.zeros(unique)
    return counts, rng.permutation(table.num_rows).astype(np.int64), rng.random(unique)


def _table_ids(table: SyntheticTable, lookups: int, seed: int, t: int, step: int,
               step_rng: np.random.Generator) -> np.ndarray:
    layout_rng = np.random.default_rng([seed, t])
    if table.zipf_alpha is not None:
        rows = layout_rng.permutation(table.num_rows).astype(np.int64)
        return rows[_zipf_ranks(step_rng, table.num_rows, lookups, table.zipf_alpha)]
    counts, pool, phase = _histogram_layout(layout_rng, table, lookups)
    ids = np.repeat(drifted_ids(pool, phase, table.drift, step), counts)
    step_rng.shuffle(ids)
    return ids


def generate_dlrm_batch(tables: Sequence[SyntheticTable], batch_size: int, seed: int = 0,
                        step: int = 0) -> DlrmBatch:
    """One dlrm_datasets batch of ``batch_size`` samples over ``tables`` (write it with
    ``write_dlrm_file``; ``load_dlrm_trace(..., batch_size=b)`` cuts it into steps of b
    samples). The same arguments give the same batch; batches of other ``step`` values (of
    the same seed) are further draws of the same tables, moved by their drift."""
    if not tables:
        raise ValueError("tables must name at least one SyntheticTable")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} must be an integer >= 0")
    all_ids, all_lengths = [], []
    for t, table in enumerate(tables):
        if not isinstance(table, SyntheticTable):
            raise ValueError(f"tables[{t}] must be a SyntheticTable, got {type(table).__name__}")
        step_rng = np.random.default_rng([seed, t, step])
        ids = _table_ids(table, int(round(batch_size * table.pooling_factor)), seed, t, step, step_rng)
        lengths = step_rng.multinomial(ids.size, np.full(batch_size, 1.0 / batch_size))
        all_ids.append(ids)
        all_lengths.append(lengths)
    lengths = torch.from_numpy(np.stack(all_lengths).astype(np.int64))
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    return check_dlrm_batch(torch.from_numpy(np.concatenate(all_ids)), offsets, lengths)
