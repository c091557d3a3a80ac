"""Compute figures of ``mtrains probe-hw`` (a ``ComputeSpec``), all on the calling thread
budget (``torch.get_num_threads()``):

- ``tbe_bytes_per_s``, ``tbe_row_update_bytes_per_s``: FBGEMM's CPU TBE
  (``SplitTableBatchedEmbeddingBagsCodegen``, HOST / CPU, one fp32 DRAM table,
  EXACT_ROWWISE_ADAGRAD), forward + backward with the fused update: the row bytes per second
  of pooled lookups and of distinct rows updated, from two batches with equal lookups and
  different numbers of distinct rows.
- ``step_overhead_s`` and ``cache_row_s``: ``TieredEmbeddingBags`` on Tier.DRAM (cache
  larger than the table, so every row stays cached after a warm-up; prefetch inline) minus
  FBGEMM on the same table and batches, at batch 1 (20 ids) and 2048: a line through the
  two (unique rows per step, extra seconds per step) points gives the cost per unique row
  (slope) and per step (intercept).
- ``dense_s_per_sample``: TorchRec DLRM ``DenseArch`` 13-512-256-64 and ``OverArch``
  415-512-512-256-1 (64 + C(27, 2) interaction features of 26 sparse features), forward +
  BCE loss + backward + SGD at batch 2048, per sample.

Each figure is the median of several steps, after warm-up steps.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.planner.types import ComputeSpec

__all__ = ["probe_compute"]

DIM = 64
POOLING = 20
BATCH = 2048
TINY_BATCH = 1
"""One bag of POOLING ids: its extra time is the per-step overhead (plus ~20 rows)."""
EPS = 1.0e-8
DENSE_LAYERS = (512, 256, 64)
OVER_LAYERS = (512, 512, 256, 1)
DENSE_IN = 13
SPARSE_FEATURES = 26


def _median_step(step: Callable[[int], None], steps: int, warmup: int = 2) -> float:
    for i in range(warmup):
        step(i)
    times: List[float] = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(warmup + i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fbgemm(rows: int) -> torch.nn.Module:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, DIM, EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01, eps=EPS, pooling_mode=PoolingMode.SUM, weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32)
    with torch.no_grad():  # touch every page outside the timed steps
        bound = rows ** -0.5
        tbe.split_embedding_weights()[0].uniform_(-bound, bound)
    return tbe


def _batches(rows: int, batch: int, count: int, seed: int) -> Tuple[List[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(rows, (batch * POOLING,), generator=gen) for _ in range(count)]
    return ids, torch.arange(0, batch * POOLING + 1, POOLING, dtype=torch.int64)


def _train_step(module: torch.nn.Module, ids: List[torch.Tensor], offsets: torch.Tensor) -> Callable[[int], None]:
    def step(i: int) -> None:
        module(ids[i % len(ids)], offsets).sum().backward()
    return step


def tbe_rates(rows: int, steps: int) -> Tuple[float, float, str]:
    """FBGEMM CPU TBE, forward + backward + update: (row bytes per second of pooled lookups,
    row bytes per second of distinct rows updated, note). Two batches with the same
    lookups -- uniform ids over ``rows`` (distinct ~ lookups) and ids over 1,024 rows
    (distinct = 1,024) -- give the two terms of ``t = lookups * b / r_l + unique * b / r_u``."""
    tbe = _fbgemm(rows)
    row_bytes = TableLayout(DIM, "fp32", "exact_row_wise_adagrad").row_bytes
    points = []
    for span in (rows, 1024):
        gen = torch.Generator().manual_seed(span)
        ids = [torch.randint(span, (BATCH * POOLING,), generator=gen) for _ in range(4)]
        offsets = torch.arange(0, BATCH * POOLING + 1, POOLING, dtype=torch.int64)
        unique = statistics.mean(float(torch.unique(x).numel()) for x in ids)
        points.append((unique, _median_step(_train_step(tbe, ids, offsets), steps)))
    (u_wide, t_wide), (u_hot, t_hot) = points
    lookups = BATCH * POOLING
    per_unique = max(1e-12, (t_wide - t_hot) / max(1.0, u_wide - u_hot))
    per_lookup = max(1e-12, (t_hot - per_unique * u_hot) / lookups)
    note = (f"FBGEMM CPU TBE, {rows:,} x {DIM} fp32, rowwise Adagrad, batch {BATCH} x pooling {POOLING}: "
            f"{t_wide * 1e3:.1f} ms/step with uniform ids ({u_wide:,.0f} distinct rows), {t_hot * 1e3:.1f} ms with "
            f"ids over 1,024 rows; t = lookups x {per_lookup * 1e9:.1f} ns + distinct rows x {per_unique * 1e9:.1f} ns")
    return row_bytes / per_lookup, row_bytes / per_unique, note


def tiered_overhead(rows: int, steps: int, work: Path) -> Tuple[float, float, str]:
    """TieredEmbeddingBags (Tier.DRAM, all rows cached) minus FBGEMM: (step_overhead_s,
    cache_row_s, note)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from torchrec_mtrains import Tier
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    fbgemm = _fbgemm(rows)
    tiered = TieredEmbeddingBags([(rows, DIM)], tier=Tier.DRAM, cache_rows=2 * rows, storage_dir=str(work),
                                 optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, eps=EPS,
                                 prefetch_pipeline=False)
    with torch.no_grad():  # warm-up: one bag of every row, so the measured steps all hit
        tiered(torch.arange(rows), torch.tensor([0, rows]))
    before = tiered.cache_stats()[tiered.table_names[0]]
    points = []
    for batch in (TINY_BATCH, BATCH):
        ids, offsets = _batches(rows, batch, 4, seed=batch)
        unique = statistics.mean(float(torch.unique(x).numel()) for x in ids)
        # alternate the two systems so a burst of load from elsewhere hits both alike
        base, ours = [], []
        for _ in range(3):
            base.append(_median_step(_train_step(fbgemm, ids, offsets), max(1, steps // 3), warmup=1))
            ours.append(_median_step(_train_step(tiered, ids, offsets), max(1, steps // 3), warmup=1))
        points.append((unique, statistics.median(ours) - statistics.median(base), statistics.median(base)))
    (u1, d1, b1), (u2, d2, b2) = points
    after = tiered.cache_stats()[tiered.table_names[0]]
    hit = (after["hits"] - before["hits"]) / max(1.0, after["unique_rows"] - before["unique_rows"])
    row_s = max(0.0, (d2 - d1) / (u2 - u1))
    step_s = max(0.0, d1 - row_s * u1)
    note = (f"TieredEmbeddingBags(Tier.DRAM, cache 2x table, inline prefetch, measured hit rate {hit:.2f}) - FBGEMM, "
            f"{rows:,} x {DIM}: +{d1 * 1e3:.2f} ms at {u1:,.0f} unique rows/step (FBGEMM {b1 * 1e3:.2f} ms), "
            f"+{d2 * 1e3:.2f} ms at {u2:,.0f} (FBGEMM {b2 * 1e3:.2f} ms)")
    return step_s, row_s, note


def dense_s_per_sample(steps: int) -> Tuple[float, str]:
    """TorchRec DLRM dense + over arch: forward, BCE loss, backward, SGD step, per sample."""
    from torchrec.models.dlrm import DenseArch, OverArch

    over_in = DENSE_LAYERS[-1] + (SPARSE_FEATURES + 1) * SPARSE_FEATURES // 2
    dense = DenseArch(DENSE_IN, list(DENSE_LAYERS))
    over = OverArch(over_in, list(OVER_LAYERS))
    params = list(dense.parameters()) + list(over.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(BATCH, DENSE_IN, generator=gen)
    inter = torch.rand(BATCH, over_in - DENSE_LAYERS[-1], generator=gen)
    y = torch.randint(2, (BATCH, 1), generator=gen).float()
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(i: int) -> None:
        opt.zero_grad()
        logits = over(torch.cat([dense(x), inter], dim=1))
        loss_fn(logits, y).backward()
        opt.step()

    t = _median_step(step, steps)
    layers = "-".join(map(str, (DENSE_IN, *DENSE_LAYERS)))
    over_layers = "-".join(map(str, (over_in, *OVER_LAYERS)))
    return t / BATCH, f"DLRM DenseArch {layers} + OverArch {over_layers}, batch {BATCH}: {t * 1e3:.1f} ms/step"


def probe_compute(quick: bool, work: Path) -> Tuple[ComputeSpec, Dict[str, str]]:
    """All compute figures; ``work`` is a scratch directory. Returns the spec and a note
    per YAML key (how each figure was measured)."""
    tbe_rows, tiered_rows, steps = (200_000, 50_000, 3) if quick else (1_000_000, 200_000, 9)
    tbe, tbe_update, tbe_note = tbe_rates(tbe_rows, steps)
    step_s, row_s, tiered_note = tiered_overhead(tiered_rows, steps, work)
    dense, dense_note = dense_s_per_sample(steps)
    spec = ComputeSpec(tbe_bytes_per_s=_r(tbe), tbe_row_update_bytes_per_s=_r(tbe_update), step_overhead_s=_r(step_s), cache_row_s=_r(row_s),
                       dense_s_per_sample=_r(dense))
    return spec, {
        "tbe_bandwidth": "pooled lookups; " + tbe_note,
        "tbe_row_update_bandwidth": "distinct rows updated; see tbe_bandwidth",
        "step_overhead": "intercept of extra seconds per step vs unique rows per step; " + tiered_note,
        "cache_row_cost": "slope of the same line (see step_overhead)",
        "dense_time_per_sample": dense_note,
    }


def _r(x: float) -> float:
    return float(f"{x:.3g}")
