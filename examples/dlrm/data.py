"""The example's data: a built-in synthetic generator, or Criteo files in TorchRec's npy form.

Synthetic (default). Deterministic: the batch of (seed, step, rank) is the same in every
run, so a resumed run sees exactly the batches it would have seen.
- Locality: each table's ids follow the reuse histogram Meta published with dlrm_datasets
  (docs/architecture.md, "Real data on locality"; ``torchrec_mtrains.stats.DLRM_DATASETS_REUSE``).
  Per table, ``torchrec_mtrains.stats.generate_dlrm_batch`` builds a reference trace with
  exactly that histogram over ``CALIBRATION_STEPS`` steps of ``CALIBRATION_BATCH``
  samples; each row's share of that trace is its probability, and every step draws its ids
  from those probabilities (so a run of that length reproduces the histogram up to
  sampling noise). Tables differ in rows, pooling factor, and so in working set.
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
    DLRM_DATASETS_REUSE,
    SyntheticTable,
    generate_dlrm_batch,
)

__all__ = ["DENSE_FEATURES", "SyntheticData", "SyntheticTableSpec", "DEFAULT_TABLES", "criteo_files",
           "criteo_batches", "scaled_tables", "table_locality"]

DENSE_FEATURES = 13
CALIBRATION_STEPS = 200  # the histogram is matched over this many steps...
CALIBRATION_BATCH = 1024  # ...of this many samples (the default run: 2 ranks x 512)


@dataclasses.dataclass(frozen=True)
class SyntheticTableSpec:
    """One synthetic table (one feature): rows, mean ids per sample, and its skew: the
    dlrm_datasets reuse histogram, or Zipf(zipf_alpha) over all rows when given."""

    name: str
    num_rows: int
    pooling_factor: float = 1.0
    zipf_alpha: Optional[float] = None


# Mixed sizes, 10K to 2M rows; the large ones multi-hot (several ids per sample). Most
# follow the published reuse histogram (small working sets); two follow Zipf laws with
# large working sets, whose misses the SSD alone cannot feed at training speed.
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


def scaled_tables(scale: float) -> List[SyntheticTableSpec]:
    """DEFAULT_TABLES with ``scale`` x their rows (at least 1,000 rows each): ``--table-scale``,
    for tests that need a run (and its checkpoints) of a few seconds."""
    if scale == 1.0:
        return list(DEFAULT_TABLES)
    return [dataclasses.replace(t, num_rows=max(1000, int(t.num_rows * scale))) for t in DEFAULT_TABLES]


def table_locality(spec: SyntheticTableSpec, global_batch: int) -> Dict[str, object]:
    """The table's locality as the planner reads it (MODEL.yaml's table keys): its Zipf
    exponent, or the reuse histogram the sampler is calibrated to, over the calibration
    trace's length in steps."""
    if spec.zipf_alpha is not None:
        return {"pooling_factor": spec.pooling_factor, "zipf_alpha": spec.zipf_alpha}
    return {
        "pooling_factor": spec.pooling_factor,
        "reuse_histogram": [float(x) for x in DLRM_DATASETS_REUSE],
        "reuse_trace_steps": CALIBRATION_STEPS * CALIBRATION_BATCH / global_batch,
    }


class _TableSampler:
    """Row probabilities of one table, calibrated to the reuse histogram, and row effects."""

    def __init__(self, spec: SyntheticTableSpec, seed: int) -> None:
        lookups_per_sample = spec.pooling_factor
        if spec.zipf_alpha is not None:  # rank r (a random row) has probability ~ r^-alpha
            rng = np.random.default_rng(seed)
            self.rows = rng.permutation(spec.num_rows).astype(np.int64)
            p = np.arange(1, spec.num_rows + 1, dtype=np.float64) ** -spec.zipf_alpha
            self.cdf = np.cumsum(p) / p.sum()
        else:
            ref = generate_dlrm_batch(
                [SyntheticTable(spec.num_rows, lookups_per_sample, reuse_histogram=DLRM_DATASETS_REUSE)],
                CALIBRATION_STEPS * CALIBRATION_BATCH, seed=seed,
            )
            rows, counts = np.unique(ref.indices.numpy(), return_counts=True)
            self.rows = rows.astype(np.int64)
            self.cdf = np.cumsum(counts, dtype=np.float64) / counts.sum()
        self.effect = np.random.default_rng(seed + 1).standard_normal(self.rows.size).astype(np.float32)
        self.pooling_factor = spec.pooling_factor

    def sample(self, rng: np.random.Generator, batch: int):
        """(lengths [batch], ids, summed effect per sample [batch])."""
        extra = self.pooling_factor - 1.0
        lengths = 1 + (rng.poisson(extra, batch) if extra > 0 else np.zeros(batch, dtype=np.int64))
        slots = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum())), side="right"),
                           self.rows.size - 1)
        owner = np.repeat(np.arange(batch), lengths)
        mean_effect = np.bincount(owner, self.effect[slots], minlength=batch) / lengths
        return lengths.astype(np.int64), self.rows[slots], mean_effect


class SyntheticData:
    """Batches of the synthetic data set; ``batch(step, rank)`` is a pure function."""

    def __init__(self, tables: Sequence[SyntheticTableSpec], batch_size: int, seed: int) -> None:
        self.tables = list(tables)
        self.batch_size = batch_size
        self.seed = seed
        self._samplers = [_TableSampler(t, seed * 1000 + i) for i, t in enumerate(self.tables)]
        w = np.random.default_rng(seed + 7).standard_normal(DENSE_FEATURES)
        self._dense_w = (w / np.linalg.norm(w)).astype(np.float32)
        self._keys = [f"f_{t.name}" for t in self.tables]

    def feature_names(self) -> List[str]:
        return list(self._keys)

    def unique_rows(self) -> Dict[str, int]:
        """Rows each table can draw (its calibrated working set)."""
        return {t.name: int(s.rows.size) for t, s in zip(self.tables, self._samplers)}

    def batch(self, step: int, rank: int, stream: int = 0) -> Batch:
        """The local batch of ``rank`` at ``step``; stream 1 is the held-out eval stream."""
        rng = np.random.default_rng([self.seed, stream, step, rank])
        b = self.batch_size
        dense = rng.standard_normal((b, DENSE_FEATURES)).astype(np.float32)
        logit = -1.0 + dense @ self._dense_w
        lengths, values = [], []
        scale = 1.5 / np.sqrt(len(self._samplers))
        for sampler in self._samplers:
            ln, ids, effect = sampler.sample(rng, b)
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
