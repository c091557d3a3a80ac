"""The tiered kernel's row path on one tier, measured: host CPU per row it loads from the
tier (its slot planned, the row read, checked and copied in) and per evicted row it writes
back (``mtrains probe-hw``: ``miss_cpu_cost`` and ``write_back_cpu_cost`` of the SCM and SSD
tiers), and on the SSD tier per row made on its first miss (``first_touch_cpu_cost``).

A ``TieredEmbeddingBags`` table on the tier, every row written first (so loads read real
rows), a cache of a tenth of it, trains Zipf(1.05) batches; the kernel's own stage counters
(``cache_stats()``: CPU time of the thread that ran each stage) give the figures over the
steps after the cache filled. For first touches the table is never written and each step
draws rows no earlier step drew: every load is a row made in place. Moves run inline (no
prefetch threads): the CPU of a stage is the same on whichever thread runs it, and nothing
else competes for the cores here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import torch

from torchrec_mtrains.types import Tier

__all__ = ["first_touch_cpu", "row_path_cpu"]

DIM = 128  # 516-B rows with the row-wise Adagrad state value
BATCH, POOLING = 2048, 20
_WRITE_CHUNK = 65_536


def row_path_cpu(tier: Tier, work: Path, rows: int, seconds: float) -> Tuple[float, float, str]:
    """(CPU seconds per row loaded, per row written back, a note saying how) of the kernel's
    row path on ``tier``, its table of ``rows`` rows in ``work``."""
    kernel = _kernel(tier, work / f"row_path_{tier.name.lower()}", rows)
    try:
        gen = torch.Generator().manual_seed(0)
        for start in range(0, rows, _WRITE_CHUNK):
            n = min(_WRITE_CHUNK, rows - start)
            kernel.set_rows(0, torch.arange(start, start + n), torch.rand(n, DIM, generator=gen) * 0.02 - 0.01, None)
        kernel.flush()
        rng = np.random.default_rng(0)
        perm = torch.from_numpy(rng.permutation(rows))
        offsets = torch.arange(0, BATCH * POOLING + 1, POOLING)

        def step() -> None:
            draw = rng.zipf(1.05, size=4 * BATCH * POOLING)
            ids = perm[torch.from_numpy(draw[draw <= rows][: BATCH * POOLING] - 1)]
            kernel(ids, offsets[: ids.numel() // POOLING + 1]).sum().backward()

        # Warm up until the cache is full (every later miss evicts a row).
        while _stats(kernel)["evictions"] < _cache_rows(rows):
            step()
        before, t0, steps = _stats(kernel), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds or steps < 3:
            step()
            steps += 1
        after = _stats(kernel)
    finally:
        kernel.close()
    loads = after["rows_loaded"] - before["rows_loaded"]
    write_backs = after["rows_written_back"] - before["rows_written_back"]
    load_ns = _load_ns(after, before)
    write_ns = _total(after, before, "write_back", "rows_written_back")
    note = (f"TieredEmbeddingBags on {tier.name}, {rows:,} x {DIM} fp32 all written, cache 10%, Zipf 1.05 batches "
            f"of {BATCH} x {POOLING}, {steps} steps: {loads / steps:,.0f} loads and {write_backs / steps:,.0f} "
            f"write-backs per step (cache_stats' stage CPU)")
    return load_ns * 1e-9 / max(1, loads), write_ns * 1e-9 / max(1, write_backs), note


def first_touch_cpu(tier: Tier, work: Path, rows: int, seconds: float) -> Tuple[float, str]:
    """(CPU seconds per row made on its first miss, a note saying how) of the kernel's row
    path on ``tier``, its table of ``rows`` rows in ``work`` never written."""
    per_step = BATCH * POOLING
    cache = _cache_rows(rows)
    kernel = _kernel(tier, work / f"first_touch_{tier.name.lower()}", rows)
    perm = torch.from_numpy(np.random.default_rng(0).permutation(rows))
    offsets = torch.arange(0, per_step + 1, POOLING)
    fresh = iter(range(0, rows - per_step + 1, per_step))

    def step() -> bool:
        start = next(fresh, None)
        if start is None:
            return False
        kernel(perm[start:start + per_step], offsets).sum().backward()
        return True

    try:
        while _stats(kernel)["evictions"] < cache and step():  # the cache full: every miss evicts
            pass
        before, t0, steps = _stats(kernel), time.perf_counter(), 0
        while (time.perf_counter() - t0 < seconds or steps < 3) and step():
            steps += 1
        after = _stats(kernel)
    finally:
        kernel.close()
    if steps < 3:
        raise ValueError(f"first_touch_cpu: {rows:,} rows leave fewer than 3 steps of fresh rows after the cache fills")
    loads = after["rows_loaded"] - before["rows_loaded"]
    note = (f"TieredEmbeddingBags on {tier.name}, {rows:,} x {DIM} fp32 never written, cache 10%, batches of "
            f"{BATCH} x {POOLING} rows no earlier step drew, {steps} steps: {loads / steps:,.0f} rows made per step "
            f"(cache_stats' stage CPU: plan, read, check, copy)")
    return _load_ns(after, before) * 1e-9 / max(1, loads), note


def _cache_rows(rows: int) -> int:
    return max(64, rows // 10)


def _kernel(tier: Tier, directory: Path, rows: int) -> torch.nn.Module:
    """The probe's table: ``rows`` x DIM on ``tier`` in ``directory``, a tenth of it cached,
    moves inline."""
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    return TieredEmbeddingBags([(rows, DIM)], tier=tier, cache_rows=[_cache_rows(rows)], storage_dir=str(directory),
                               learning_rate=0.01, prefetch_pipeline=False)


def _load_ns(after: Dict[str, float], before: Dict[str, float]) -> float:
    """CPU ns of the stages that load rows (the plan that gives them slots included)."""
    return sum(_total(after, before, s, "rows_loaded") for s in ("plan", "read", "verify", "copy"))


def _stats(kernel: torch.nn.Module) -> Dict[str, float]:
    (stats,) = kernel.cache_stats().values()
    return stats


def _total(after: Dict[str, float], before: Dict[str, float], stage: str, rows_key: str) -> float:
    """CPU ns of a stage between two snapshots (the stats give it per row of ``rows_key``)."""
    key = f"{stage}_cpu_ns_per_row"
    return after[key] * max(1.0, after[rows_key]) - before[key] * max(1.0, before[rows_key])
