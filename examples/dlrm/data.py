"""The example's data: a built-in synthetic generator, or Criteo files in TorchRec's npy form.

Synthetic (default). Deterministic: the batch of (seed, step, rank) is the same in every
run, so a resumed run sees exactly the batches it would have seen.
- Locality: each table's ids follow the reuse histogram Meta published with dlrm_datasets
  (docs/architecture.md, "Real data on locality"): the share of lookups by the reuse count of
  their row (``torchrec_mtrains.stats.DLRM_DATASETS_LOOKUP_SHARES``), 6.9 lookups per unique
  row. Per table, ``torchrec_mtrains.stats.generate_dlrm_batch`` builds a reference trace
  with exactly that histogram over one dlrm_datasets batch (``CALIBRATION_SAMPLES``
  samples; fewer for a small table, so that the trace touches at most half its rows); each
  row's share of that trace is its probability, and every step draws its ids from those
  probabilities (so a run of that length reproduces the histogram up to sampling noise).
  Tables differ in rows, pooling factor, and so in working set.
- Drift (``drift``, train.py's ``--drift``): each step that share of the reference trace's
  rows, ranked by lookups, moves to fresh ids (``torchrec_mtrains.stats.drifted_ids``; the
  fresh ids are the table's rows outside the reference trace, in random order), as new ids
  arrive in real traffic. A fresh id takes its rank's effect (below), so its row must be
  learned. Zipf tables draw over all their rows and do not drift.
- Signal: every row that can appear has a hidden effect ~ N(0, 1); a sample's logit is a
  linear function of its 13 dense features plus, per table, the mean effect of its ids;
  labels ~ Bernoulli(sigmoid(logit)). The best possible AUC is about 0.8.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains.stats import (
    DLRM_DATASETS_LOOKUP_SHARES,
    SyntheticTable,
    drifted_ids,
    drifted_positions,
    generate_dlrm_batch,
    lookups_per_unique_row,
)
from torchrec_mtrains.stats.large_tables import KeyedPermutation, expected_distinct_zipf, hashed_normal, zipf_ranks

__all__ = ["DENSE_FEATURES", "LARGE_TABLE_ROWS", "SyntheticData", "SyntheticTableSpec", "DEFAULT_TABLES",
           "calibration_samples",
           "criteo_files", "criteo_batches", "hashed_down", "scaled_tables", "table_locality"]

DENSE_FEATURES = 13
CALIBRATION_SAMPLES = 65_536  # the histogram is matched over one dlrm_datasets batch...
CALIBRATION_MAX_TABLE_SHARE = 0.5  # ...or fewer samples, touching at most this share of the rows
# Tables above this many rows are sampled without per-row arrays (a table of 300M rows would
# need 4.8 GB of them per rank): ranks map to rows by a keyed bijection, Zipf tails by their
# integral, row effects by a hash (torchrec_mtrains.stats.large_tables).
LARGE_TABLE_ROWS = 1 << 24


@dataclasses.dataclass(frozen=True)
class SyntheticTableSpec:
    """One synthetic table (one feature): rows, mean ids per sample, and its skew: the
    dlrm_datasets reuse histogram, or Zipf(zipf_alpha) over all rows when given."""

    name: str
    num_rows: int
    pooling_factor: float = 1.0
    zipf_alpha: Optional[float] = None


# Mixed sizes, 10K to 2M rows; the large ones multi-hot (several ids per sample). Most
# follow the published reuse histogram (working sets of 2-50% of the table, moving with
# the drift); two follow Zipf laws over all their rows, whose misses the SSD alone cannot
# feed at training speed.
DEFAULT_TABLES: Sequence[SyntheticTableSpec] = (
    SyntheticTableSpec("t0_2m", 2_000_000, 4.0),
    SyntheticTableSpec("t1_1m", 1_000_000, 8.0, zipf_alpha=0.9),
    SyntheticTableSpec("t10_1m", 1_000_000, 4.0, zipf_alpha=1.1),
    SyntheticTableSpec("t2_500k", 500_000, 2.0),
    SyntheticTableSpec("t3_200k", 200_000, 1.0),
    SyntheticTableSpec("t4_100k", 100_000, 1.0),
    SyntheticTableSpec("t5_50k", 50_000, 1.0),
    SyntheticTableSpec("t6_20k", 20_000, 1.0),
    SyntheticTableSpec("t7_10k", 10_000, 1.0),
    SyntheticTableSpec("t8_10k", 10_000, 1.0),
    SyntheticTableSpec("t9_10k", 10_000, 1.0),
)


def scaled_tables(scale: float, tables: Sequence[SyntheticTableSpec] = DEFAULT_TABLES) -> List[SyntheticTableSpec]:
    """``tables`` with ``scale`` x their rows (at least 1,000 rows each): ``--table-scale``,
    for tests that need a run (and its checkpoints) of a few seconds."""
    if scale == 1.0:
        return list(tables)
    return [dataclasses.replace(t, num_rows=max(1000, int(t.num_rows * scale))) for t in tables]


def hashed_down(tables: Sequence[SyntheticTableSpec], max_rows: Optional[int]) -> List[SyntheticTableSpec]:
    """``tables`` with at most ``max_rows`` rows each (``--max-rows``): the model whose ids
    ``SyntheticData(max_rows=...)`` hashes down into them."""
    if max_rows is None:
        return list(tables)
    return [dataclasses.replace(t, num_rows=min(t.num_rows, max_rows)) for t in tables]


def calibration_samples(spec: SyntheticTableSpec) -> int:
    """Samples of the table's reference trace: one dlrm_datasets batch, or fewer when that
    would touch more than ``CALIBRATION_MAX_TABLE_SHARE`` of the table's rows (the rest are
    the fresh ids of the drift)."""
    rows = CALIBRATION_MAX_TABLE_SHARE * spec.num_rows * lookups_per_unique_row(DLRM_DATASETS_LOOKUP_SHARES)
    return max(1, min(CALIBRATION_SAMPLES, int(rows / spec.pooling_factor)))


def table_locality(spec: SyntheticTableSpec, global_batch: int, steps: Optional[int] = None,
                   drift: float = 0.0) -> Dict[str, object]:
    """The table's locality as the planner reads it (MODEL.yaml's table keys): its Zipf
    exponent, or the reuse histogram (shares of lookups) the sampler is calibrated to, over
    the reference trace's length in steps and its drift; for a table of more than ``LARGE_TABLE_ROWS`` rows
    and a run of ``steps`` steps, also the rows the run is expected to write."""
    if spec.zipf_alpha is not None:
        out: Dict[str, object] = {"pooling_factor": spec.pooling_factor, "zipf_alpha": spec.zipf_alpha}
    else:
        out = {
            "pooling_factor": spec.pooling_factor,
            "reuse_histogram": [float(x) for x in DLRM_DATASETS_LOOKUP_SHARES],
            "reuse_trace_steps": calibration_samples(spec) / global_batch,
            "drift": drift,
        }
    if steps is not None and spec.num_rows > LARGE_TABLE_ROWS:
        out["rows_written"] = _LargeTableSampler(spec, 0, drift).expected_rows(steps, global_batch)
    return out


def _draw_lengths(rng: np.random.Generator, batch: int, pooling_factor: float) -> np.ndarray:
    """Ids per sample: 1 + Poisson(pooling_factor - 1), int64 [batch]."""
    extra = pooling_factor - 1.0
    return (1 + (rng.poisson(extra, batch) if extra > 0 else np.zeros(batch, dtype=np.int64))).astype(np.int64)


def _mean_per_sample(lengths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Mean of each sample's ``values`` (one per id, samples in order) [len(lengths)]."""
    owner = np.repeat(np.arange(lengths.size), lengths)
    return np.bincount(owner, values, minlength=lengths.size) / lengths


class _TableSampler:
    """Row probabilities of one table, calibrated to the reuse histogram, row effects, and
    the drift of its ids."""

    def __init__(self, spec: SyntheticTableSpec, seed: int, drift: float = 0.0) -> None:
        lookups_per_sample = spec.pooling_factor
        self.drift = 0.0
        if spec.zipf_alpha is not None:  # rank r (a random row) has probability ~ r^-alpha
            rng = np.random.default_rng(seed)
            self.rows = rng.permutation(spec.num_rows).astype(np.int64)
            p = np.arange(1, spec.num_rows + 1, dtype=np.float64) ** -spec.zipf_alpha
            self.cdf = np.cumsum(p) / p.sum()
        else:
            ref = generate_dlrm_batch(
                [SyntheticTable(spec.num_rows, lookups_per_sample, reuse_histogram=DLRM_DATASETS_LOOKUP_SHARES)],
                calibration_samples(spec), seed=seed,
            )
            rows, counts = np.unique(ref.indices.numpy(), return_counts=True)
            order = np.argsort(-counts, kind="stable")  # ranks: most looked-up first
            self.rows = rows[order].astype(np.int64)
            self.cdf = np.cumsum(counts[order], dtype=np.float64) / counts.sum()
            if drift:
                rng = np.random.default_rng([seed, 2])
                rest = np.setdiff1d(np.arange(spec.num_rows, dtype=np.int64), self.rows, assume_unique=True)
                self.pool = np.concatenate([self.rows, rng.permutation(rest)])
                self.phase = rng.random(self.rows.size)
                self.drift = float(drift)
        self.effect = np.random.default_rng(seed + 1).standard_normal(self.rows.size).astype(np.float32)
        self.pooling_factor = spec.pooling_factor

    @property
    def ranks(self) -> int:
        """Rows the table can draw at a step."""
        return int(self.rows.size)

    def sample(self, rng: np.random.Generator, batch: int, step: int = 0):
        """(lengths [batch], ids, summed effect per sample [batch]) of ``step``."""
        lengths = _draw_lengths(rng, batch, self.pooling_factor)
        slots = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum())), side="right"),
                           self.rows.size - 1)
        ids = drifted_ids(self.pool, self.phase, self.drift, step, slots) if self.drift else self.rows[slots]
        return lengths, ids, _mean_per_sample(lengths, self.effect[slots])


class _LargeTableSampler:
    """``_TableSampler``'s distribution for a table of more than ``LARGE_TABLE_ROWS`` rows,
    in memory independent of its rows: rank r is row ``perm(r)`` (drift: generation g of
    rank r is ``perm((g * U + r) mod num_rows)``), its effect a hash of r."""

    def __init__(self, spec: SyntheticTableSpec, seed: int, drift: float = 0.0) -> None:
        self.num_rows, self.alpha, self.seed = spec.num_rows, spec.zipf_alpha, seed
        self.perm = KeyedPermutation(spec.num_rows, seed)
        self.pooling_factor = spec.pooling_factor
        self.drift = 0.0
        if self.alpha is None:
            samples = calibration_samples(spec)
            # Only the lookup count of each rank matters: calibrate on a table just large
            # enough for the trace's unique rows.
            rows = min(spec.num_rows, 2 * int(samples * spec.pooling_factor) + 1000)
            ref = generate_dlrm_batch(
                [SyntheticTable(rows, spec.pooling_factor, reuse_histogram=DLRM_DATASETS_LOOKUP_SHARES)],
                samples, seed=seed,
            )
            counts = np.sort(np.unique(ref.indices.numpy(), return_counts=True)[1])[::-1]
            self.cdf = np.cumsum(counts, dtype=np.float64) / counts.sum()
            self.ranks = counts.size
            self.phase = np.random.default_rng([seed, 2]).random(self.ranks) if drift else None
            self.drift = float(drift)
        else:
            self.ranks = spec.num_rows

    def expected_rows(self, steps: int, global_batch: int) -> int:
        """Distinct rows a run of ``steps`` steps of ``global_batch`` samples draws: Zipf
        draws over all rows; a histogram rank draws its id of each generation (one per
        1/drift steps) with probability 1 - exp(-its lookups per generation)."""
        lookups = float(steps) * global_batch * self.pooling_factor
        if self.alpha is not None:
            return int(expected_distinct_zipf(self.num_rows, self.alpha, lookups))
        p = np.diff(self.cdf, prepend=0.0)
        if not self.drift:
            return int(min(self.num_rows, -np.expm1(-p * lookups).sum()))
        generations = 1.0 + steps * self.drift
        per_generation = p * lookups / generations
        return int(min(self.num_rows, generations * -np.expm1(-per_generation).sum()))

    def sample(self, rng: np.random.Generator, batch: int, step: int = 0):
        """(lengths [batch], ids, summed effect per sample [batch]) of ``step``."""
        lengths = _draw_lengths(rng, batch, self.pooling_factor)
        n = int(lengths.sum())
        if self.alpha is not None:
            ranks = zipf_ranks(rng, self.num_rows, n, self.alpha)
        else:
            ranks = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"), self.ranks - 1)
        pos = drifted_positions(self.phase, self.drift, step, ranks, self.num_rows) if self.drift else ranks
        return lengths, self.perm(pos), _mean_per_sample(lengths, hashed_normal(self.seed + 1, ranks))


def _sampler(spec: SyntheticTableSpec, seed: int, drift: float):
    """The table's sampler: per-row arrays up to ``LARGE_TABLE_ROWS`` rows, functions above."""
    if spec.num_rows > LARGE_TABLE_ROWS:
        return _LargeTableSampler(spec, seed, drift)
    return _TableSampler(spec, seed, drift)


class SyntheticData:
    """Batches of the synthetic data set; ``batch(step, rank)`` is a pure function."""

    def __init__(self, tables: Sequence[SyntheticTableSpec], batch_size: int, seed: int, drift: float = 0.0,
                 max_rows: Optional[int] = None) -> None:
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 0 <= drift < 1:
            raise ValueError(f"drift={drift!r} must be a number in [0, 1)")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows={max_rows!r} must be a positive integer")
        self.max_rows = max_rows  # ids of larger tables are hashed down (mod) into this many rows
        self.tables = list(tables)
        self.batch_size = batch_size
        self.seed = seed
        self._samplers = [_sampler(t, seed * 1000 + i, drift) for i, t in enumerate(self.tables)]
        w = np.random.default_rng(seed + 7).standard_normal(DENSE_FEATURES)
        self._dense_w = (w / np.linalg.norm(w)).astype(np.float32)
        self._keys = [f"f_{t.name}" for t in self.tables]

    def feature_names(self) -> List[str]:
        return list(self._keys)

    def unique_rows(self) -> Dict[str, int]:
        """Rows each table can draw at a step (its calibrated working set)."""
        return {t.name: int(s.ranks) for t, s in zip(self.tables, self._samplers)}

    def batch(self, step: int, rank: int, stream: int = 0) -> Batch:
        """The local batch of ``rank`` at ``step``; stream 1 is the held-out eval stream."""
        rng = np.random.default_rng([self.seed, stream, step, rank])
        b = self.batch_size
        dense = rng.standard_normal((b, DENSE_FEATURES)).astype(np.float32)
        logit = -1.0 + dense @ self._dense_w
        lengths, values = [], []
        scale = 1.5 / np.sqrt(len(self._samplers))
        for sampler in self._samplers:
            ln, ids, effect = sampler.sample(rng, b, step)
            if self.max_rows is not None:
                ids = ids % self.max_rows  # ids are spread by their permutation: mod hashes
            lengths.append(ln)
            values.append(ids)
            logit = logit + scale * effect
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self._keys, values=torch.from_numpy(np.concatenate(values)),
            lengths=torch.from_numpy(np.concatenate(lengths)),
        )
        return Batch(dense_features=torch.from_numpy(dense), sparse_features=kjt, labels=torch.from_numpy(labels))

    def batches(self, start: int, stop: int, rank: int, stream: int = 0) -> Iterator[Batch]:
        for step in range(start, stop):
            yield self.batch(step, rank, stream)


# ------------------------------------------------------------------------------ Criteo ----
def criteo_files(data_dir: str) -> List[str]:
    """Prefixes ``P`` of the ``P_dense.npy``/``P_sparse.npy``/``P_labels.npy`` triples in
    ``data_dir`` (TorchRec's npy form of Criteo Kaggle or Terabyte, made by
    ``torchrec/datasets/scripts/npy_preproc_criteo.py``), sorted.

    Raises:
        ValueError: not a directory, or no complete triple in it (the message says what to do).
    """
    if not os.path.isdir(data_dir):
        raise ValueError(f"--data-dir {data_dir!r} is not a directory")
    prefixes = sorted(p[: -len("_dense.npy")] for p in glob.glob(os.path.join(data_dir, "*_dense.npy")))
    prefixes = [p for p in prefixes if os.path.exists(p + "_sparse.npy") and os.path.exists(p + "_labels.npy")]
    if not prefixes:
        raw = [f for f in os.listdir(data_dir) if f in ("train.txt", "day_0") or f.startswith("day_")]
        hint = (f" It holds raw Criteo files ({', '.join(sorted(raw)[:3])}): convert them first with "
                "torchrec/datasets/scripts/npy_preproc_criteo.py.") if raw else ""
        raise ValueError(
            f"--data-dir {data_dir!r} holds no Criteo files in TorchRec's npy form "
            f"(<name>_dense.npy, <name>_sparse.npy, <name>_labels.npy).{hint}"
        )
    return prefixes


def criteo_batches(prefixes: Sequence[str], batch_size: int, rank: int, world_size: int, rows_per_table: int,
                   stage: str = "train") -> Iterator[Batch]:
    """TorchRec's InMemoryBinaryCriteoIterDataPipe over the files; ids hashed into
    ``rows_per_table`` rows. ``stage`` "train" reads all files, "val" the first half of
    the last file (TorchRec's split)."""
    from torchrec.datasets.criteo import (
        CAT_FEATURE_COUNT,
        InMemoryBinaryCriteoIterDataPipe,
    )

    files = list(prefixes) if stage == "train" else [prefixes[-1]]
    pipe = InMemoryBinaryCriteoIterDataPipe(
        stage, [p + "_dense.npy" for p in files], [p + "_sparse.npy" for p in files],
        [p + "_labels.npy" for p in files], batch_size, rank, world_size, drop_last=True,
        mmap_mode=True, hashes=[rows_per_table] * CAT_FEATURE_COUNT,
    )
    return iter(pipe)
