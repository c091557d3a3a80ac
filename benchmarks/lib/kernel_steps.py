"""Timed training steps of the kernel benchmark: FBGEMM all in DRAM vs TieredEmbeddingBags.

A step is ``out = module(indices, offsets); out.sum().backward()`` (FBGEMM's fused
EXACT_ROWWISE_ADAGRAD update runs in backward). TieredEmbeddingBags also gets
``prefetch(next batch)`` at the start of each step, so its tier I/O for step i+1 overlaps
step i. Systems are measured side by side: after a warm-up, blocks of the baseline and of
ours alternate over the same batches and each step is timed; medians of the step times
are compared, so a burst of load from other processes hits both sides alike.

Each block of ours is self-contained: the first batch is prefetched inside the block (its
step pays the un-overlapped load) and the last step prefetches nothing, so no I/O runs
while the baseline is measured and the cache counters are exact per block.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.lib.common import ProcIo, read_proc_io, zipf_ids
from benchmarks.lib.settings import Progress
from benchmarks.lib.types import KernelBenchConfig, PhaseResult

__all__ = ["Batches", "SideBySide", "TieredRun", "close_quietly", "make_batches", "make_fbgemm",
           "make_tiered", "run_side_by_side"]

EPS = 1.0e-8
"""Adagrad epsilon of both systems (FBGEMM's default)."""

BASELINE_WARMUP_STEPS = 5
"""Baseline steps before its first block (allocator, CPU caches); its weights are
already touched when it is built."""

STAT_KEYS = ("hits", "unique_rows", "lookups", "rows_loaded", "rows_written_back", "tier_seconds",
             "prefetch_wait_seconds", "evictions")
"""Cumulative ``cache_stats()`` keys reported as deltas over the measured blocks."""


@dataclass
class Batches:
    """One workload: distinct batches, used in order by every system.

    Attributes:
        alpha: Zipf exponent.
        warmup: Steps before the first measured one.
        indices: int64 [lookups] per step (``batch * pooling`` ids, bag-major).
        offsets: int64 [batch + 1] offsets shared by all steps (fixed pooling).
        order: int64 [rows], the id of each Zipf rank (most probable first).
    """

    alpha: float
    warmup: int
    indices: list[Any]
    offsets: Any
    order: np.ndarray

    def step_ids(self) -> list[np.ndarray]:
        """Each step's ids as numpy arrays (the reference policies' input)."""
        return [t.numpy() for t in self.indices]


def make_batches(cfg: KernelBenchConfig, alpha: float, seed: int, warmup: int) -> Batches:
    """``warmup + blocks * block_steps`` distinct batches of Zipf(alpha) ids over one
    shuffled id order."""
    import torch

    rng = np.random.default_rng(seed)
    steps = warmup + cfg.blocks * cfg.block_steps
    order = rng.permutation(cfg.rows).astype(np.int64)
    ids = zipf_ids(rng, cfg.rows, steps * cfg.lookups_per_step, alpha, order).reshape(steps, -1)
    tensors = [torch.from_numpy(row) for row in ids]  # views of one array, each contiguous
    offsets = torch.arange(0, cfg.lookups_per_step + 1, cfg.pooling, dtype=torch.int64)
    return Batches(alpha, warmup, tensors, offsets, order)


def _init_bound(rows: int) -> float:
    """TorchRec's default init range half-width, 1/sqrt(rows) (the kernel's default too)."""
    return (1.0 / rows) ** 0.5


def make_fbgemm(cfg: KernelBenchConfig) -> Any:
    """FBGEMM's CPU TBE with the table in host DRAM, every weight page touched.

    FBGEMM allocates the weights with zeros (pages fault in on first touch); filling them
    with uniform(+-1/sqrt(rows)) values here keeps page faults out of the measurement.
    """
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(cfg.rows, cfg.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=cfg.learning_rate, eps=EPS,
        pooling_mode=PoolingMode.NONE if cfg.sequence else PoolingMode.SUM, weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
    )
    with torch.no_grad():
        tbe.split_embedding_weights()[0].uniform_(-_init_bound(cfg.rows), _init_bound(cfg.rows))
        for state in tbe.split_optimizer_states()[0]:
            state.zero_()
    return tbe


@dataclass
class TieredRun:
    """A TieredEmbeddingBags instance and how it was prepared.

    Attributes:
        kernel: The module.
        storage_dir: Its table files.
        fill_seconds: Seconds to write every row first (0 when not filled).
        fill_rows: Rows written by the fill.
    """

    kernel: Any
    storage_dir: Path
    fill_seconds: float = 0.0
    fill_rows: int = 0


def make_tiered(cfg: KernelBenchConfig, tier_name: str, policy: str, storage_dir: Path, fill: bool,
                progress: Progress) -> TieredRun:
    """Builds ``TieredEmbeddingBags`` on ``tier_name`` ("SCM" or "SSD"); with ``fill``,
    writes every row (uniform weights, zero state) with ``set_rows`` in chunks so misses
    read written rows from the device, not the lazy initialiser."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

    from torchrec_mtrains import Tier
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    kernel = TieredEmbeddingBags(
        [(cfg.rows, cfg.dim)], tier=Tier[tier_name], cache_load_factor=cfg.cache_load_factor,
        storage_dir=str(storage_dir), optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=cfg.learning_rate, eps=EPS, cache_algorithm=policy, prefetch_pipeline=True,
        seed=cfg.seed, pooling_mode=PoolingMode.NONE if cfg.sequence else PoolingMode.SUM,
    )
    run = TieredRun(kernel, storage_dir)
    if not fill:
        return run
    gen = torch.Generator().manual_seed(cfg.seed)
    bound = _init_bound(cfg.rows)
    chunks = range(0, cfg.rows, cfg.fill_chunk_rows)
    update = progress(f"fill {tier_name}", len(chunks))
    t0 = time.perf_counter()
    for start in chunks:
        n = min(cfg.fill_chunk_rows, cfg.rows - start)
        weights = torch.empty(n, cfg.dim).uniform_(-bound, bound, generator=gen)
        kernel.set_rows(0, torch.arange(start, start + n), weights, torch.zeros(n))
        update(1)
    run.fill_seconds = time.perf_counter() - t0
    run.fill_rows = cfg.rows
    return run


def _block(module: Any, batches: Batches, steps: range, prefetch: bool) -> list[float]:
    """Runs ``steps`` (indices into ``batches``) and returns each step's seconds."""
    idx, off = batches.indices, batches.offsets
    times: list[float] = []
    if prefetch:
        module.prefetch(idx[steps[0]], off)
    for j, s in enumerate(steps):
        t0 = time.perf_counter()
        if prefetch and j + 1 < len(steps):
            module.prefetch(idx[steps[j + 1]], off)
        module(idx[s], off).sum().backward()
        times.append(time.perf_counter() - t0)
    return times


@dataclass
class _Side:
    """Step times and counters of one system over the measured blocks."""

    times: list[list[float]] = field(default_factory=list)
    cpu_s: float = 0.0
    io: ProcIo = ProcIo(0, 0)
    block_stats: list[dict[str, float]] = field(default_factory=list)

    @property
    def flat(self) -> list[float]:
        return [t for block in self.times for t in block]


@dataclass
class SideBySide:
    """The results of one side-by-side (or ours-only) measurement.

    Attributes:
        ours: Ours' figures.
        baseline: The baseline's figures, None for ours-only runs.
    """

    ours: PhaseResult
    baseline: Optional[PhaseResult]


def _timed_block(side: _Side, module: Any, batches: Batches, steps: range, prefetch: bool,
                 stats: Optional[Callable[[], dict[str, float]]]) -> None:
    gc.collect()
    io0, c0 = read_proc_io(), time.process_time()
    side.times.append(_block(module, batches, steps, prefetch))
    side.cpu_s += time.process_time() - c0
    io1 = read_proc_io()
    if io0 is not None and io1 is not None:
        d = io1 - io0
        side.io = ProcIo(side.io.read_bytes + d.read_bytes, side.io.write_bytes + d.write_bytes)
    if stats is not None:
        side.block_stats.append(stats())


def _timing_extra(times: list[list[float]]) -> dict[str, Any]:
    flat = [t for block in times for t in block]
    med = statistics.median(flat)
    q = np.percentile(flat, [25, 75, 90])
    return {
        "steps": len(flat),
        "median_step_ms": 1e3 * med,
        "mean_step_ms": 1e3 * statistics.fmean(flat),
        "p25_step_ms": 1e3 * float(q[0]),
        "p75_step_ms": 1e3 * float(q[1]),
        "p90_step_ms": 1e3 * float(q[2]),
        "steps_per_s": 1.0 / med,
        "block_steps_per_s": ",".join(f"{len(b) / sum(b):.3f}" for b in times),
        "block_median_steps_per_s": ",".join(f"{1 / statistics.median(b):.3f}" for b in times),
    }


def run_side_by_side(
    cfg: KernelBenchConfig, phase: str, run: TieredRun, batches: Batches, baseline: Optional[Any],
    progress: Progress, log: Callable[[str], None],
) -> SideBySide:
    """Warms ``run.kernel`` up, then alternates baseline and ours blocks (ours only without
    a baseline) over the same batches; returns both sides' figures."""
    kernel = run.kernel
    W, S = batches.warmup, cfg.block_steps
    update = progress(f"{phase}", W + cfg.blocks * S * (2 if baseline is not None else 1))
    t0 = time.perf_counter()
    for start in range(0, W, S):  # warm-up, in blocks like the measurement
        _block(kernel, batches, range(start, min(W, start + S)), True)
        update(min(W, start + S) - start)
    warmup_s = time.perf_counter() - t0
    if baseline is not None:
        for s in range(BASELINE_WARMUP_STEPS):
            _block(baseline, batches, range(s, s + 1), False)
    stats = lambda: dict(kernel.cache_stats()["table_0"])  # noqa: E731
    before = stats()
    ours, base = _Side(), _Side()
    for k in range(cfg.blocks):
        steps = range(W + k * S, W + (k + 1) * S)
        if baseline is not None:
            _timed_block(base, baseline, batches, steps, False, None)
            update(S)
        _timed_block(ours, kernel, batches, steps, True, stats)
        update(S)
        log(f"  {phase} block {k}: ours {S / sum(ours.times[-1]):.2f} steps/s"
            + (f", fbgemm {S / sum(base.times[-1]):.2f} steps/s" if baseline is not None else ""))
    return SideBySide(
        _ours_result(cfg, phase, run, batches, ours, before, warmup_s),
        _baseline_result(cfg, phase, batches, base) if baseline is not None else None,
    )


def _ours_result(cfg: KernelBenchConfig, phase: str, run: TieredRun, batches: Batches, side: _Side,
                 before: dict[str, float], warmup_s: float) -> PhaseResult:
    after = side.block_stats[-1]
    n = len(side.flat)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in STAT_KEYS}
    per_block_hit, prev = [], before
    for s in side.block_stats:
        u = s["unique_rows"] - prev["unique_rows"]
        per_block_hit.append((s["hits"] - prev["hits"]) / u if u else float("nan"))
        prev = s
    extra: dict[str, Any] = {
        **_timing_extra(side.times),
        "zipf_alpha": batches.alpha,
        "cache_algorithm": run.kernel.cache_algorithm,
        "tier": run.kernel.tier.name,
        "hit_rate": d["hits"] / d["unique_rows"] if d["unique_rows"] else float("nan"),
        "block_hit_rate": ",".join(f"{h:.4f}" for h in per_block_hit),
        "hits": d["hits"],
        "unique_rows": d["unique_rows"],
        "unique_rows_per_step": d["unique_rows"] / n,
        "rows_loaded_per_step": d["rows_loaded"] / n,
        "rows_written_back_per_step": d["rows_written_back"] / n,
        "evictions_per_step": d["evictions"] / n,
        "tier_ms_per_step": 1e3 * d["tier_seconds"] / n,
        "prefetch_wait_ms_per_step": 1e3 * d["prefetch_wait_seconds"] / n,
        "cpu_ms_per_step": 1e3 * side.cpu_s / n,
        "proc_read_bytes_per_step": side.io.read_bytes / n,
        "proc_write_bytes_per_step": side.io.write_bytes / n,
        "cache_rows": float(run.kernel.cache_rows[0]),
        "cache_capacity_rows": after.get("cache_capacity_rows", float("nan")),
        "fill_seconds": run.fill_seconds,
        "fill_rows": run.fill_rows,
        "warmup_steps": batches.warmup,
        "warmup_seconds": warmup_s,
    }
    return PhaseResult("ours", phase, n * cfg.lookups_per_step, sum(side.flat), side.cpu_s, extra)


def _baseline_result(cfg: KernelBenchConfig, phase: str, batches: Batches, side: _Side) -> PhaseResult:
    n = len(side.flat)
    extra = {**_timing_extra(side.times), "zipf_alpha": batches.alpha,
             "cpu_ms_per_step": 1e3 * side.cpu_s / n}
    return PhaseResult("fbgemm", phase, n * cfg.lookups_per_step, sum(side.flat), side.cpu_s, extra)


def close_quietly(run: TieredRun) -> float:
    """Closes the kernel (flush + stop its prefetch thread); returns the seconds it took."""
    t0 = time.perf_counter()
    run.kernel.close()
    return time.perf_counter() - t0
