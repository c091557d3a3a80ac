"""Compute figures of ``mtrains probe-hw`` (a ``ComputeSpec``), all on the calling thread
budget (``torch.get_num_threads()``):

- ``tbe_bytes_per_s``, ``tbe_row_update_bytes_per_s``: FBGEMM's CPU TBE
  (``SplitTableBatchedEmbeddingBagsCodegen``, HOST / CPU, one fp32 DRAM table,
  EXACT_ROWWISE_ADAGRAD), forward + backward with the fused update: the row bytes per second
  of pooled lookups and of distinct rows updated, from two batches with equal lookups and
  different numbers of distinct rows.
- The tiered kernel's own cost (``step_overhead_s``, ``lookup_s``, ``cache_row_s`` on the
  step's critical path; ``step_background_cpu_s``, ``lookup_background_cpu_s`` on its
  worker threads): ``TieredEmbeddingBags`` on Tier.DRAM (cache larger than the table, so
  every row stays cached after a warm-up), run as training runs it (the next batch
  prefetched while a step computes), minus FBGEMM on the same table and batches, at three
  batches, in wall and in process CPU time (``tiered_overhead``).
- The dense fields: ``probe_dense`` (a dense layer's cost from its shape).
- ``framework_step_s``, ``framework_table_s``: ``probe_framework`` (TorchRec's training
  step beyond lookups and dense layers).

Each figure is the median of several steps, after warm-up steps.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.planner.hardware import probe_framework as pf
from torchrec_mtrains.planner.hardware.probe_dense import dense_costs
from torchrec_mtrains.planner.hardware.probe_framework import framework_costs, row_wise_group_cost
from torchrec_mtrains.planner.hardware.timing import nonneg_fit, step_clock
from torchrec_mtrains.planner.model.model_spec import DenseSpec
from torchrec_mtrains.planner.types import ComputeSpec

__all__ = ["probe_compute"]

DIM = 64
POOLING = 20
BATCH = 2048
TINY_BATCH = 1
"""One bag of POOLING ids: its extra time is the per-step overhead (plus ~20 rows)."""
EPS = 1.0e-8


def _median_step(step: Callable[[int], None], steps: int, warmup: int = 2) -> float:
    clock = step_clock()
    for i in range(warmup):
        step(i)
    times: List[float] = []
    for i in range(steps):
        t0 = clock()
        step(warmup + i)
        times.append(clock() - t0)
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


def _timed_steps(module: torch.nn.Module, ids: List[torch.Tensor], offsets: torch.Tensor, steps: int,
                 prefetch: bool) -> Tuple[float, float]:
    """(median seconds of a training step by ``step_clock``, mean process CPU seconds of a
    step, all threads), run as the training pipeline runs it: with ``prefetch``, the next
    batch is handed to ``module.prefetch`` before the step computes, so the kernel's worker
    threads plan and move it while the step runs. One warm-up step first."""
    clock = step_clock()
    times: List[float] = []
    cpu = 0.0
    total = steps + 1
    if prefetch:
        module.prefetch(ids[0], offsets)
    for i in range(total):
        c0, t0 = time.process_time(), clock()
        if prefetch and i + 1 < total:
            module.prefetch(ids[(i + 1) % len(ids)], offsets)
        module(ids[i % len(ids)], offsets).sum().backward()
        if i:
            times.append(clock() - t0)
            cpu += time.process_time() - c0
    return statistics.median(times), cpu / steps


def tiered_overhead(rows: int, steps: int, work: Path) -> Tuple[Dict[str, float], str]:
    """TieredEmbeddingBags (Tier.DRAM, every row cached, the prefetch pipeline on) minus
    FBGEMM on the same table and batches, in wall time and in process CPU time, at three
    batches: one bag (``TINY_BATCH``), ``BATCH`` bags of uniform ids, and ``BATCH`` bags of
    ids over 1,024 rows. Returns the ``ComputeSpec`` fields (``step_overhead_s``,
    ``lookup_s``, ``cache_row_s``, ``step_background_cpu_s``, ``lookup_background_cpu_s``)
    and a note.

    The extra time per step (``step_clock``: the calling thread's CPU time with one torch
    thread) is fitted as ``step + lookups x lookup + unique x row`` (the critical path); the
    extra process CPU time beyond it (the worker threads) as ``step + lookups x lookup``.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from torchrec_mtrains import Tier
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    fbgemm = _fbgemm(rows)
    tiered = TieredEmbeddingBags([(rows, DIM)], tier=Tier.DRAM, cache_rows=2 * rows, storage_dir=str(work),
                                 optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, eps=EPS,
                                 prefetch_pipeline=True)
    try:
        with torch.no_grad():  # warm-up: one bag of every row, so the measured steps all hit
            tiered(torch.arange(rows), torch.tensor([0, rows]))
        before = tiered.cache_stats()[tiered.table_names[0]]
        points = []
        for batch, span in ((TINY_BATCH, rows), (BATCH, rows), (BATCH, 1024)):
            gen = torch.Generator().manual_seed(batch + span)
            ids = [torch.randint(span, (batch * POOLING,), generator=gen) for _ in range(4)]
            offsets = torch.arange(0, batch * POOLING + 1, POOLING, dtype=torch.int64)
            unique = statistics.mean(float(torch.unique(x).numel()) for x in ids)
            reps = steps * (8 if batch == TINY_BATCH else 1)  # tiny steps are fast and noisy
            # alternate the two systems so a burst of load from elsewhere hits both alike
            base, ours = [], []
            for _ in range(3):
                base.append(_timed_steps(fbgemm, ids, offsets, max(2, reps // 3), prefetch=False))
                ours.append(_timed_steps(tiered, ids, offsets, max(2, reps // 3), prefetch=True))
            wall = statistics.median(o[0] for o in ours) - statistics.median(b[0] for b in base)
            cpu = statistics.median(o[1] for o in ours) - statistics.median(b[1] for b in base)
            points.append((float(batch * POOLING), unique, wall, max(0.0, cpu - max(0.0, wall)),
                           statistics.median(b[0] for b in base)))
        after = tiered.cache_stats()[tiered.table_names[0]]
    finally:
        tiered.close()
    hit = (after["hits"] - before["hits"]) / max(1.0, after["unique_rows"] - before["unique_rows"])
    # Each point's residual relative to its FBGEMM step: the 40 ms steps jitter by +-2 ms,
    # more than the whole overhead of the short ones.
    scales = [base for _, _, _, _, base in points]
    step_s, lookup_s, row_s = nonneg_fit([((1.0, lookups, unique), wall) for lookups, unique, wall, _, _ in points],
                                         scales)
    bg_step, bg_lookup = nonneg_fit([((1.0, lookups), bg) for lookups, _, _, bg, _ in points], scales)
    fields = {"step_overhead_s": step_s, "lookup_s": lookup_s, "cache_row_s": row_s,
              "step_background_cpu_s": bg_step, "lookup_background_cpu_s": bg_lookup}
    measured = "; ".join(f"{lookups:,.0f} lookups / {unique:,.0f} unique: +{wall * 1e3:.2f} ms "
                         f"(FBGEMM {base * 1e3:.2f} ms), workers +{bg * 1e3:.2f} ms CPU"
                         for lookups, unique, wall, bg, base in points)
    note = (f"TieredEmbeddingBags(Tier.DRAM, cache 2x table, prefetch pipeline, measured hit rate {hit:.2f}) - "
            f"FBGEMM, {rows:,} x {DIM}, per step: {measured}")
    return fields, note


def probe_compute(quick: bool, work: Path, ranks_per_node: int = 1) -> Tuple[ComputeSpec, Dict[str, str]]:
    """All compute figures; ``work`` is a scratch directory; the framework's cost is measured
    with ``ranks_per_node`` ranks on this node. Returns the spec and a note per YAML key (how
    each figure was measured)."""
    tbe_rows, tiered_rows, steps = (200_000, 50_000, 3) if quick else (1_000_000, 200_000, 9)
    tbe, tbe_update, tbe_note = tbe_rates(tbe_rows, steps)
    tiered, tiered_note = tiered_overhead(tiered_rows, steps, work)
    dense, dense_notes = dense_costs(steps)
    framework, framework_notes = framework_costs(5 if quick else 30, _modeled_dlrm(tbe, tbe_update, dense),
                                                  ranks_per_node, repeats=1 if quick else 3)
    group, group_notes = row_wise_group_cost(5 if quick else 30, ranks_per_node, repeats=1 if quick else 3)
    framework = {**framework, **group}
    framework_notes = {**framework_notes, **group_notes}
    spec = ComputeSpec(tbe_bytes_per_s=_r(tbe), tbe_row_update_bytes_per_s=_r(tbe_update),
                       **{k: _r(v) for k, v in {**tiered, **dense, **framework}.items()})
    return spec, {
        "tbe_bandwidth": "pooled lookups; " + tbe_note,
        "tbe_row_update_bandwidth": "distinct rows updated; see tbe_bandwidth",
        "step_overhead": "critical path, fixed per kernel and step: fit of extra wall seconds per step = "
                         "step + lookups x lookup_cost + unique rows x cache_row_cost; " + tiered_note,
        "lookup_cost": "critical path, per lookup; see step_overhead",
        "cache_row_cost": "critical path, per unique row; see step_overhead",
        "step_background_cpu": "the kernel's worker threads (prefetch plan, row I/O), fixed per step: fit of "
                               "extra process CPU seconds beyond the extra wall seconds = step + lookups x "
                               "lookup_background_cpu; see step_overhead",
        "lookup_background_cpu": "the worker threads, per lookup; see step_background_cpu",
        **dense_notes,
        **framework_notes,
    }


def _modeled_dlrm(tbe: float, tbe_update: float, dense: Dict[str, float]) -> Callable[[int, int, int], float]:
    """What the TBE and dense figures give a step of ``probe_framework``'s DLRM."""

    def modeled(tables: int, batch: int, dim: int) -> float:
        row_bytes = TableLayout(dim, "fp32", "exact_row_wise_adagrad").row_bytes
        widths = [(pf.DENSE_IN, *pf.dense_mlp(dim)), (pf.over_in(tables, dim), *pf.OVER_MLP)]
        spec = DenseSpec.of_shapes([(a, b) for w in widths for a, b in zip(w, w[1:])])
        lookups = tables * batch  # one id per sample and table
        unique = tables * min(batch, pf.ROWS)
        return (lookups * row_bytes / tbe + unique * row_bytes / tbe_update
                + batch * (spec.macs_per_sample * dense["dense_mac_s"]
                           + spec.outputs_per_sample * dense["dense_activation_s"])
                + spec.layers * dense["dense_layer_s"])
    return modeled


def _r(x: float) -> float:
    return float(f"{x:.3g}")
