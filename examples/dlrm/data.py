"""The example's data: a built-in synthetic generator, or Criteo files in TorchRec's npy form
(one-hot, or MLPerf DLRM-DCNv2's materialized multi-hot).

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
import re
import zipfile
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

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

__all__ = ["DENSE_FEATURES", "LARGE_TABLE_ROWS", "RAW_ID_BITS", "SyntheticData", "SyntheticTableSpec", "DEFAULT_TABLES",
           "calibration_samples", "CRITEO_ROWS", "MultiHotCriteoBatches",
           "criteo_files", "criteo_batches", "criteo_multi_hot_sizes", "criteo_splits", "criteo_table_rows",
           "expected_live_ids", "hashed_down", "raw_ids", "scaled_tables", "table_locality", "table_sampler"]

DENSE_FEATURES = 13
CALIBRATION_SAMPLES = 65_536  # the histogram is matched over one dlrm_datasets batch...
CALIBRATION_MAX_TABLE_SHARE = 0.5  # ...or fewer samples, touching at most this share of the rows
# Tables above this many rows are sampled without per-row arrays (a table of 300M rows would
# need 4.8 GB of them per rank): ranks map to rows by a keyed bijection, Zipf tails by their
# integral, row effects by a hash (torchrec_mtrains.stats.large_tables).
LARGE_TABLE_ROWS = 1 << 24
# Raw ids (--virtual-tables) lie in [0, 2^50): TorchRec's virtual space. (Its collection
# still makes a meta tensor of num_embeddings x dim, whose bytes must fit an int64.)
RAW_ID_BITS = 50
_RAW_MASK = np.uint64((1 << RAW_ID_BITS) - 1)


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
        out["run_steps"] = steps
    return out


def expected_live_ids(spec: SyntheticTableSpec, global_batch: int, steps: int, drift: float = 0.0) -> int:
    """Distinct ids a run of ``steps`` steps draws from the table: what a virtual table of
    it holds when nothing is evicted."""
    return max(1, _LargeTableSampler(spec, 0, drift).expected_rows(steps, global_batch))


def raw_ids(ids: np.ndarray, key: int) -> np.ndarray:
    """Row ids as raw ids: a keyed bijection of [0, 2^RAW_ID_BITS) (multiply by odd
    constants and xor-shift, all mod 2^RAW_ID_BITS), so distinct rows stay distinct ids,
    spread over the whole space as hashed user and item ids are."""
    x = (ids.astype(np.uint64) ^ np.uint64(key & int(_RAW_MASK))) & _RAW_MASK
    with np.errstate(over="ignore"):
        x = (x * np.uint64(0x9E3779B97F4A7C15)) & _RAW_MASK
        x ^= x >> np.uint64(29)
        x = (x * np.uint64(0xBF58476D1CE4E5B9)) & _RAW_MASK
        x ^= x >> np.uint64(31)
    return x.astype(np.int64)


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
        ids, effects = self.draw(rng, int(lengths.sum()), step)
        return lengths, ids, _mean_per_sample(lengths, effects)

    def draw(self, rng: np.random.Generator, n: int, step: int = 0):
        """(ids, their rows' effects) of ``n`` lookups at ``step``."""
        slots = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"), self.rows.size - 1)
        ids = drifted_ids(self.pool, self.phase, self.drift, step, slots) if self.drift else self.rows[slots]
        return ids, self.effect[slots]


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
        ids, effects = self.draw(rng, int(lengths.sum()), step)
        return lengths, ids, _mean_per_sample(lengths, effects)

    def draw(self, rng: np.random.Generator, n: int, step: int = 0):
        """(ids, their rows' effects) of ``n`` lookups at ``step``."""
        if self.alpha is not None:
            ranks = zipf_ranks(rng, self.num_rows, n, self.alpha)
        else:
            ranks = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"), self.ranks - 1)
        pos = drifted_positions(self.phase, self.drift, step, ranks, self.num_rows) if self.drift else ranks
        return self.perm(pos), hashed_normal(self.seed + 1, ranks)


def table_sampler(spec: SyntheticTableSpec, seed: int, drift: float = 0.0):
    """The table's sampler (``draw(rng, n, step)`` -> ids and their effects; ``sample``):
    per-row arrays up to ``LARGE_TABLE_ROWS`` rows, functions above."""
    return _sampler(spec, seed, drift)


def _sampler(spec: SyntheticTableSpec, seed: int, drift: float):
    """The table's sampler: per-row arrays up to ``LARGE_TABLE_ROWS`` rows, functions above."""
    if spec.num_rows > LARGE_TABLE_ROWS:
        return _LargeTableSampler(spec, seed, drift)
    return _TableSampler(spec, seed, drift)


class SyntheticData:
    """Batches of the synthetic data set; ``batch(step, rank)`` is a pure function."""

    def __init__(self, tables: Sequence[SyntheticTableSpec], batch_size: int, seed: int, drift: float = 0.0,
                 max_rows: Optional[int] = None, raw_id_tables: Sequence[str] = ()) -> None:
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not 0 <= drift < 1:
            raise ValueError(f"drift={drift!r} must be a number in [0, 1)")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows={max_rows!r} must be a positive integer")
        self.max_rows = max_rows  # ids of larger tables are hashed down (mod) into this many rows
        self.tables = list(tables)
        # Tables fed raw ids (virtual tables): their row ids through raw_ids, never hashed down.
        self._raw = [t.name in set(raw_id_tables) for t in self.tables]
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
        for i, sampler in enumerate(self._samplers):
            ln, ids, effect = sampler.sample(rng, b, step)
            if self._raw[i]:
                ids = raw_ids(ids, self.seed * 1000 + i)
            elif self.max_rows is not None:
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
CRITEO_ROWS = 1_000_000  # rows per Criteo table by default (ids hashed into them)
_DENSE, _SPARSE, _MULTI_HOT, _LABELS = "_dense.npy", "_sparse.npy", "_sparse_multi_hot.npz", "_labels.npy"


def _natural_key(path: str) -> List[object]:
    """Sort key putting day_2 before day_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", os.path.basename(path))]


def _unlabelled(prefix: str) -> bool:
    """Whether the file has no labels: TorchRec writes -1 for Kaggle's test.txt."""
    labels = np.load(prefix + _LABELS, mmap_mode="r")
    return labels.size > 0 and int(labels.reshape(-1)[0]) == -1


def criteo_files(data_dir: str, multi_hot: bool = False) -> List[str]:
    """Prefixes ``P`` of the labelled Criteo files in ``data_dir``, in day order.

    One-hot: ``P_dense.npy``/``P_sparse.npy``/``P_labels.npy`` (TorchRec's npy form of Criteo
    Kaggle or Terabyte, made by ``python -m torchrec.datasets.scripts.npy_preproc_criteo``).
    ``multi_hot``: ``P_sparse_multi_hot.npz`` instead of ``P_sparse.npy`` (MLPerf DLRM-DCNv2's
    materialized multi-hot Criteo). Files without labels (Kaggle's test set) are left out.

    Raises:
        ValueError: not a directory, or no complete labelled set in it (the message says what to do).
    """
    if not os.path.isdir(data_dir):
        raise ValueError(f"--criteo-dir {data_dir!r} is not a directory")
    sparse = _MULTI_HOT if multi_hot else _SPARSE
    prefixes = [p[: -len(_DENSE)] for p in glob.glob(os.path.join(data_dir, "*" + _DENSE))]
    prefixes = sorted((p for p in prefixes if os.path.exists(p + sparse) and os.path.exists(p + _LABELS)),
                      key=_natural_key)
    labelled = [p for p in prefixes if not _unlabelled(p)]
    if not labelled:
        raw = [f for f in os.listdir(data_dir) if f in ("train.txt", "test.txt") or re.fullmatch(r"day_\d+", f)]
        hint = (f" It holds raw Criteo files ({', '.join(sorted(raw, key=_natural_key)[:3])}): convert them first "
                "with `python -m torchrec.datasets.scripts.npy_preproc_criteo` (docs/example.md).") if raw else ""
        if prefixes:
            hint = f" Its files {[os.path.basename(p) for p in prefixes]} have no labels (Kaggle's test set)."
        raise ValueError(
            f"--criteo-dir {data_dir!r} holds no Criteo files in TorchRec's npy form "
            f"(<name>_dense.npy, <name>{sparse}, <name>_labels.npy).{hint}"
        )
    return labelled


def criteo_table_rows(text: str, max_rows: Optional[int] = None) -> List[int]:
    """Rows of the 26 Criteo tables from ``--criteo-rows``: one count for all, or 26
    comma-separated (MLPerf's ``--num_embeddings_per_feature``), each at most ``max_rows``.

    Raises:
        ValueError: not 1 or 26 positive integers (naming the text).
    """
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT

    try:
        rows = [int(x) for x in str(text).split(",")]
    except ValueError:
        rows = []
    if len(rows) not in (1, CAT_FEATURE_COUNT) or min(rows, default=0) < 1:
        raise ValueError(f"--criteo-rows {text!r} must be one positive integer or {CAT_FEATURE_COUNT} "
                         "comma-separated ones")
    rows = rows * CAT_FEATURE_COUNT if len(rows) == 1 else rows
    return [min(r, max_rows) for r in rows] if max_rows is not None else rows


def criteo_splits(prefixes: Sequence[str]) -> Dict[str, Tuple[List[str], str]]:
    """{"train": (files, stage), "eval": (files, stage)} for ``criteo_batches``: TorchRec's
    split of the Terabyte days (train on all files but the last, evaluate on the first half
    of the last, its "val" stage); a single file (Kaggle's train.txt) trains on its first
    half ("val") and is evaluated on its second ("test"), so the AUC is always held out."""
    if len(prefixes) == 1:
        return {"train": ([prefixes[0]], "val"), "eval": ([prefixes[0]], "test")}
    return {"train": (list(prefixes[:-1]), "train"), "eval": ([prefixes[-1]], "val")}


def criteo_multi_hot_sizes(prefix: str) -> List[int]:
    """Ids per sample of each of the 26 features of a multi-hot file (its arrays' widths)."""
    return [a.shape[1] for a in _npz_memmaps(prefix + _MULTI_HOT)]


def criteo_batches(prefixes: Sequence[str], batch_size: int, rank: int, world_size: int,
                   rows_per_table: Union[int, Sequence[int]], stage: str = "train", multi_hot: bool = False):
    """This rank's batches of the files (an iterable with ``len``): TorchRec's
    InMemoryBinaryCriteoIterDataPipe, or ``MultiHotCriteoBatches`` with ``multi_hot``; ids
    hashed into ``rows_per_table`` rows (one count, or one per feature). ``stage``: "train"
    reads all files, "val" the first half of the first file, "test" its second half
    (TorchRec's convention; ``criteo_splits`` picks them)."""
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT, InMemoryBinaryCriteoIterDataPipe

    hashes = [rows_per_table] * CAT_FEATURE_COUNT if isinstance(rows_per_table, int) else list(rows_per_table)
    files = list(prefixes) if stage == "train" else [prefixes[0]]
    if multi_hot:
        return MultiHotCriteoBatches(files, stage, batch_size, rank, world_size, hashes)
    return InMemoryBinaryCriteoIterDataPipe(
        stage, [p + _DENSE for p in files], [p + _SPARSE for p in files], [p + _LABELS for p in files],
        batch_size, rank, world_size, drop_last=True, mmap_mode=True, hashes=hashes,
    )


def _npz_memmaps(path: str) -> List[np.ndarray]:
    """The arrays ``0.npy`` ... ``25.npy`` of an uncompressed npz (``np.savez``), memory-mapped:
    the 1 TB multi-hot files do not fit in RAM.

    Raises:
        ValueError: a member is missing or compressed.
    """
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT

    out = []
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        for k in range(CAT_FEATURE_COUNT):
            try:
                info = zf.getinfo(f"{k}.npy")
            except KeyError:
                raise ValueError(f"{path}: no array '{k}' (expected one per feature, 0..25)") from None
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{path}: array '{k}' is compressed (write it with np.savez, not savez_compressed)")
            f.seek(info.header_offset)
            header = f.read(30)  # the local file header; its name and extra lengths at bytes 26-29
            f.seek(info.header_offset + 30 + int.from_bytes(header[26:28], "little")
                   + int.from_bytes(header[28:30], "little"))
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            out.append(np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                                 order="F" if fortran else "C"))
    return out


class MultiHotCriteoBatches:
    """This rank's batches of MLPerf DLRM-DCNv2's multi-hot Criteo files (``P_dense.npy``,
    ``P_labels.npy``, ``P_sparse_multi_hot.npz`` holding one int32 array [samples, ids per
    sample] per feature, named ``0`` to ``25``), in the order and split of TorchRec's
    InMemoryBinaryCriteoIterDataPipe with ``drop_last``: global batch g of the concatenated
    files goes to rank g mod world_size. A minimal reader of that layout: TorchRec's package
    ships no multi-hot reader (MLPerf's ``MultiHotCriteoIterDataPipe`` lives in its
    reference code)."""

    def __init__(self, prefixes: Sequence[str], stage: str, batch_size: int, rank: int, world_size: int,
                 hashes: Sequence[int]) -> None:
        from torchrec.datasets.criteo import DEFAULT_CAT_NAMES

        if stage not in ("train", "val", "test"):
            raise ValueError(f"stage={stage!r} must be 'train', 'val' or 'test'")
        self.dense = [np.load(p + _DENSE, mmap_mode="r") for p in prefixes]
        self.labels = [np.load(p + _LABELS, mmap_mode="r") for p in prefixes]
        self.sparse = [_npz_memmaps(p + _MULTI_HOT) for p in prefixes]
        if stage != "train":  # TorchRec's split of the first file: "val" its first half, "test" the rest
            half = (len(self.dense[0]) + 1) // 2
            cut = slice(None, half) if stage == "val" else slice(half, None)
            self.dense[0], self.labels[0] = self.dense[0][cut], self.labels[0][cut]
            self.sparse[0] = [a[cut] for a in self.sparse[0]]
        self.sizes = [a.shape[1] for a in self.sparse[0]]
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.hashes = np.asarray(hashes, dtype=np.int64)
        self.keys = list(DEFAULT_CAT_NAMES)
        self.starts = np.cumsum([0] + [len(d) for d in self.dense])  # first global row of each file

    def __len__(self) -> int:
        return int(self.starts[-1]) // (self.batch_size * self.world_size)

    def _rows(self, arrays: Sequence[np.ndarray], lo: int, hi: int) -> np.ndarray:
        """Global rows [lo, hi) of per-file ``arrays``, across file boundaries."""
        parts = []
        for i, a in enumerate(arrays):
            a_lo, a_hi = max(lo, int(self.starts[i])), min(hi, int(self.starts[i + 1]))
            if a_lo < a_hi:
                parts.append(a[a_lo - self.starts[i]: a_hi - self.starts[i]])
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[Batch]:
        b = self.batch_size
        for local in range(len(self)):
            lo = (local * self.world_size + self.rank) * b
            values = [
                (self._rows([s[k] for s in self.sparse], lo, lo + b).astype(np.int64) % self.hashes[k]).reshape(-1)
                for k in range(len(self.keys))
            ]
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=self.keys, values=torch.from_numpy(np.concatenate(values)),
                lengths=torch.from_numpy(np.repeat(np.asarray(self.sizes, dtype=np.int64), b)),
            )
            yield Batch(dense_features=torch.from_numpy(np.asarray(self._rows(self.dense, lo, lo + b))),
                        sparse_features=kjt,
                        labels=torch.from_numpy(np.asarray(self._rows(self.labels, lo, lo + b)).reshape(-1)))
