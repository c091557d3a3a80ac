"""Synthetic traces in dlrm_datasets' format, calibrated to a Zipf exponent or to a reuse
histogram (such as dlrm_datasets' published one), deterministic for a seed.

- Zipf(alpha) table: ``B * pooling_factor`` ids drawn independently with
  P(rank k) proportional to k^-alpha over the table's rows, ranks mapped to rows by a random
  permutation (so hot rows are spread over the table, as hashed ids are).
- Reuse-histogram table: ``U`` unique rows, ``U`` chosen so the expected lookups are
  ``B * pooling_factor``; each bin gets its share of the rows (largest remainder rounding),
  a row's lookup count is drawn log-uniformly inside its bin (lo, hi] (16K+: (16K, 32K]),
  and the ids are shuffled over the batch. The histogram is reproduced up to rounding of
  ``U * share``; the pooling factor only approximately (the lookups are what the counts add
  up to). Accesses are independent of time (no temporal drift).

Lengths: the table's lookups spread over the B samples multinomially (mean = pooling factor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from torchrec_mtrains.stats.dlrm_trace import DlrmBatch, check_dlrm_batch
from torchrec_mtrains.stats.types import REUSE_BIN_EDGES

__all__ = ["DLRM_DATASETS_REUSE", "SyntheticTable", "generate_dlrm_batch", "zipf_ids"]

DLRM_DATASETS_REUSE: Tuple[float, ...] = (0.069, 0.044, 0.068, 0.101, 0.122, 0.104, 0.073, 0.058, 0.052,
                                          0.050, 0.049, 0.048, 0.048, 0.042, 0.031, 0.042)
"""Reuse histogram published with Meta's dlrm_datasets (README, "Reuse pattern"): share of
unique rows in the bins of ``REUSE_BIN_EDGES``."""

_OPEN_BIN_RATIO = 2.0  # the open last bin (16K+) is drawn from (16K, 32K]


@dataclass(frozen=True)
class SyntheticTable:
    """One synthetic table: give exactly one of ``zipf_alpha`` and ``reuse_histogram``.

    Attributes:
        num_rows: rows of the table.
        pooling_factor: mean ids per sample.
        zipf_alpha: Zipf exponent (> 0).
        reuse_histogram: share of unique rows per bin of ``REUSE_BIN_EDGES`` (16 values,
            normalised to sum 1).
    """

    num_rows: int
    pooling_factor: float
    zipf_alpha: Optional[float] = None
    reuse_histogram: Optional[Sequence[float]] = None

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
            h = np.asarray(self.reuse_histogram, dtype=np.float64)
            if h.shape != (len(REUSE_BIN_EDGES) - 1,) or np.any(h < 0) or not h.sum() > 0:
                raise ValueError(f"reuse_histogram must be {len(REUSE_BIN_EDGES) - 1} shares >= 0 "
                                 f"with a positive sum, got {self.reuse_histogram!r}")


def zipf_ids(rng: np.random.Generator, num_rows: int, count: int, alpha: float) -> np.ndarray:
    """``count`` ids of Zipf(alpha) ranks over ``num_rows`` rows, ranks mapped to rows by a
    random permutation."""
    p = np.arange(1, num_rows + 1, dtype=np.float64) ** -float(alpha)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(count), side="right"), num_rows - 1)
    return rng.permutation(num_rows).astype(np.int64)[ranks]


def _bin_counts(shares: np.ndarray, unique: int) -> np.ndarray:
    """Rows per bin summing to ``unique`` (largest remainder)."""
    exact = shares * unique
    out = np.floor(exact).astype(np.int64)
    rest = unique - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


def _histogram_ids(rng: np.random.Generator, table: SyntheticTable, lookups: int) -> np.ndarray:
    shares = np.asarray(table.reuse_histogram, dtype=np.float64)
    shares = shares / shares.sum()
    lo = np.asarray(REUSE_BIN_EDGES[:-1], dtype=np.float64)
    hi = np.asarray(REUSE_BIN_EDGES[1:], dtype=np.float64)
    hi[-1] = lo[-1] * _OPEN_BIN_RATIO
    # Mean lookups of a row of each bin: count = ceil(e^u) with u uniform on
    # (ln max(lo, 1), ln hi], integers in (lo, hi]; the mean of e^u (+0.5 for the ceiling).
    llo, lhi = np.log(np.maximum(lo, 1.0)), np.log(hi)
    mean = np.where(lhi > llo, (hi - np.maximum(lo, 1.0)) / np.maximum(lhi - llo, 1e-12) + 0.5, hi)
    unique = max(1, int(round(lookups / float(shares @ mean))))
    if unique > table.num_rows:
        raise ValueError(f"reuse_histogram with pooling_factor={table.pooling_factor} needs {unique} unique rows, "
                         f"more than num_rows={table.num_rows}")
    per_bin = _bin_counts(shares, unique)
    bins = np.repeat(np.arange(shares.size), per_bin)
    u = rng.random(unique)
    counts = np.ceil(np.exp(llo[bins] + u * (lhi[bins] - llo[bins]))).astype(np.int64)
    counts = np.clip(counts, lo[bins].astype(np.int64) + 1, hi[bins].astype(np.int64))
    rows = rng.choice(table.num_rows, size=unique, replace=False).astype(np.int64)
    ids = np.repeat(rows, counts)
    rng.shuffle(ids)
    return ids


def generate_dlrm_batch(tables: Sequence[SyntheticTable], batch_size: int, seed: int = 0) -> DlrmBatch:
    """One dlrm_datasets batch of ``batch_size`` samples over ``tables`` (write it with
    ``write_dlrm_file``; ``load_dlrm_trace(..., batch_size=b)`` cuts it into steps of b
    samples). The same arguments give the same batch."""
    if not tables:
        raise ValueError("tables must name at least one SyntheticTable")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    rng = np.random.default_rng(seed)
    all_ids, all_lengths = [], []
    for t, table in enumerate(tables):
        if not isinstance(table, SyntheticTable):
            raise ValueError(f"tables[{t}] must be a SyntheticTable, got {type(table).__name__}")
        lookups = int(round(batch_size * table.pooling_factor))
        if table.zipf_alpha is not None:
            ids = zipf_ids(rng, table.num_rows, lookups, table.zipf_alpha)
        else:
            ids = _histogram_ids(rng, table, lookups)
        lengths = rng.multinomial(ids.size, np.full(batch_size, 1.0 / batch_size))
        all_ids.append(ids)
        all_lengths.append(lengths)
    lengths = torch.from_numpy(np.stack(all_lengths).astype(np.int64))
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    return check_dlrm_batch(torch.from_numpy(np.concatenate(all_ids)), offsets, lengths)
