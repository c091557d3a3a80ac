"""The ``cold_uniform_32k`` case: one cold read call of the block store against fio.

One table of ``case_rows`` rows (default 4M x (128 + 1) fp32 = 516 B/row, about 2 GB: the
row layout of a dim-128 table with row-wise Adagrad state), every row written. Then,
``case_repeats`` times: the page cache dropped, fio's 4 KiB random reads at QD 32 on its own
file, the page cache dropped, the table reopened with the DRAM cache off (O_DIRECT), ONE
``read`` call of ``case_batch`` uniform random ids (each row checked by its id column) timed
alone, the table closed. A last fio run closes the sequence, so every read sits between two
fio runs and is compared with their mean: the device's speed drifts within seconds on shared
disks, and a pair measured seconds apart is what a ratio can be read from. The case's ratio
is the median over the repeats; its goal is 0.8x.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.lib.baselines import fio
from benchmarks.lib.common import Stopwatch, drop_page_cache, make_rows, rows_mismatch
from benchmarks.lib.types import BaselineUnavailable, PhaseResult, StoreBenchConfig

__all__ = ["CASE", "FIO_PHASE", "GOAL", "run_cold_case"]

CASE = "cold_uniform_32k"
"""Name of the case (``--case``) and of its phase in the results ("ours")."""

FIO_PHASE = CASE + "_fio"
"""Phase of the case's fio runs in the results ("fio"); not a ``randread_4k_qd32*`` key,
so the main run's read target does not mix them in."""

GOAL = 0.8
"""The case passes when the median read rate is at least this share of fio's IOPS."""

LOAD_BATCH = 65_536
"""Rows per write call while the table is filled."""

Progress = Callable[[str, int], Callable[[int], None]]


def _fill(store: Any, torch: Any, cfg: StoreBenchConfig, progress: Progress) -> None:
    update = progress(f"{CASE} load", cfg.case_rows)
    for lo in range(0, cfg.case_rows, LOAD_BATCH):
        ids = np.arange(lo, min(cfg.case_rows, lo + LOAD_BATCH), dtype=np.int64)
        store.write(torch.from_numpy(ids), torch.from_numpy(make_rows(ids, cfg.row_width, 0, cfg.seed)))
        update(len(ids))
    store.flush()


def _fio_run(cfg: StoreBenchConfig, directory: Path) -> PhaseResult:
    """One fio 4 KiB random-read run at QD 32 on the case's fio file (kept for the next)."""
    job = fio.FioJob(FIO_PHASE, "randread", 4096, 32)
    drop_page_cache([])
    return fio.run_fio(directory, [job], cfg.fio_size_mb, cfg.case_fio_runtime_s, keep=True)[FIO_PHASE]


def _read_once(BlockStore: Any, torch: Any, cfg: StoreBenchConfig, path: Path,
               repeat: int) -> tuple[Stopwatch, int, float]:
    """Reopens the table cold and times one read call; returns (time, wrong rows, device reads)."""
    ids = np.random.default_rng((cfg.seed, 32, repeat)).integers(0, cfg.case_rows, cfg.case_batch)
    drop_page_cache([path])
    store = BlockStore.open(str(path), dram_cache_mb=0.0, direct_io=True, io_engine=cfg.io_engine,
                            queue_depth=cfg.queue_depth, io_threads=cfg.io_threads)
    try:
        tids = torch.from_numpy(ids)
        reads0 = store.stats().get("device_reads", 0.0)
        with Stopwatch() as sw:
            rows = store.read(tids)
        reads = store.stats().get("device_reads", 0.0) - reads0
    finally:
        store.close()
    return sw, rows_mismatch(rows.numpy(), ids), reads


def run_cold_case(BlockStore: Any, cfg: StoreBenchConfig, directory: Path, progress: Progress,
                  log: Callable[[str], None]) -> tuple[dict[str, dict[str, PhaseResult]], Optional[str]]:
    """Runs the case (see the module doc); deletes its table and fio file at the end.

    Args:
        BlockStore: The store class (``torchrec_mtrains.storage.BlockStore``).
        cfg: Benchmark settings (``case_*``, ``fio_size_mb``, the store's I/O settings).
        directory: Where the table and fio's file go.
        progress: Progress-bar factory.
        log: Prints one line.

    Returns:
        ({"ours": {CASE: ...}, "fio": {FIO_PHASE: ...}}, why fio did not run or None).
        The ours result holds the per-repeat rates and ratios and ``ratio_to_fio`` (median).
    """
    import torch

    path = directory / f"{CASE}.tbl"
    fio_skip: Optional[str] = None
    fio_runs: list[PhaseResult] = []
    reads: list[tuple[Stopwatch, int, float]] = []

    def fio_step() -> None:
        nonlocal fio_skip
        if fio_skip is None and not cfg.skip_fio:
            try:
                fio_runs.append(_fio_run(cfg, directory))
            except BaselineUnavailable as e:
                fio_skip = str(e)

    try:
        store = BlockStore(str(path), cfg.case_rows, cfg.dim, state_dim=cfg.state_dim,
                           dtype=torch.float32, dram_cache_mb=0.0, direct_io=True,
                           io_engine=cfg.io_engine, queue_depth=cfg.queue_depth,
                           io_threads=cfg.io_threads, overwrite=True)
        try:
            _fill(store, torch, cfg, progress)
            engine = str(store.io_engine)
            store.read(torch.arange(min(cfg.case_rows, 64)))  # page the read path's code in
        finally:
            store.close()
        update = progress(CASE, cfg.case_repeats)
        for r in range(cfg.case_repeats):
            fio_step()
            reads.append(_read_once(BlockStore, torch, cfg, path, r))
            log(f"{CASE}: read {r + 1}: {cfg.case_batch / reads[-1][0].seconds:,.0f} rows/s"
                + (f" (fio before it: {float(fio_runs[-1].extra['iops']):,.0f} IOPS)" if fio_runs else ""))
            update(1)
        fio_step()
    finally:
        if not cfg.keep:
            path.unlink(missing_ok=True)
            (directory / "fio.dat").unlink(missing_ok=True)
    return _results(cfg, reads, fio_runs, engine), fio_skip


def _results(cfg: StoreBenchConfig, reads: list[tuple[Stopwatch, int, float]],
             fio_runs: list[PhaseResult], engine: str) -> dict[str, dict[str, PhaseResult]]:
    rates = [cfg.case_batch / sw.seconds for sw, _, _ in reads]
    extra: dict[str, Any] = {
        "table_rows": cfg.case_rows, "batch": cfg.case_batch, "queue_depth": cfg.queue_depth,
        "io_engine": engine, "dram_cache_mb": 0.0,
        "errors": sum(e for _, e, _ in reads),
        "device_reads": sum(d for _, _, d in reads),
        "rows_per_s_each": ",".join(f"{x:.0f}" for x in rates),
    }
    out: dict[str, dict[str, PhaseResult]] = {}
    if len(fio_runs) == len(reads) + 1:
        iops = [float(r.extra["iops"]) for r in fio_runs]
        around = [(a + b) / 2 for a, b in zip(iops, iops[1:])]
        ratios = [x / f for x, f in zip(rates, around)]
        extra.update(fio_iops_each=",".join(f"{x:.0f}" for x in iops),
                     ratios=",".join(f"{x:.2f}" for x in ratios),
                     ratio_to_fio=statistics.median(ratios), goal=GOAL)
        ios, secs = sum(r.rows for r in fio_runs), sum(r.seconds for r in fio_runs)
        out["fio"] = {FIO_PHASE: PhaseResult("fio", FIO_PHASE, ios, secs, None, {
            "iops": ios / secs, "MBps": ios * 4096 / secs / 1e6, "runs": len(fio_runs),
            "iodepth": 32, "block_bytes": 4096,
            **{k: statistics.median(float(r.extra[k]) for r in fio_runs)
               for k in ("clat_p50_us", "clat_p99_us")}})}
    out["ours"] = {CASE: PhaseResult("ours", CASE, cfg.case_batch * len(reads),
                                     sum(sw.seconds for sw, _, _ in reads),
                                     sum(sw.cpu_s for sw, _, _ in reads), extra)}
    return out
