"""numpy.memmap baseline: the same rows in one flat float32 file, read through the page cache.

Reads are fancy indexing of the memmap (``mm[ids]`` copies the rows out), one page
fault at a time (queue depth 1). Writes are assignment plus ``flush()`` (msync).
The page cache is not limited to the cache fraction: with enough RAM it caches the
whole file once touched, so warm and Zipf figures are an upper bound for mmap.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
import numpy as np

from benchmarks.lib.common import (
    IdWorkload, Stopwatch, drop_page_cache, make_rows, read_proc_io, rows_mismatch,
)
from benchmarks.lib.types import PhaseResult, StoreBenchConfig

__all__ = ["run_memmap"]

Progress = Callable[[str, int], Callable[[int], None]]
"""progress(description, total) -> update(n): a tqdm-like progress factory."""


def _open(path: Path, cfg: StoreBenchConfig, mode: str) -> np.memmap:
    mm = np.memmap(path, dtype=np.float32, mode=mode, shape=(cfg.rows, cfg.row_width))
    raw = getattr(mm, "_mmap", None)  # numpy keeps the mmap.mmap object here
    if cfg.memmap_madvise == "random" and raw is not None and hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)  # no readahead: a 516-byte row should not pull 128 KiB
    return mm


def _io_extra(io0: object, rows: int, row_bytes: int) -> dict[str, float]:
    io1 = read_proc_io()
    if io0 is None or io1 is None:
        return {}
    d = io1 - io0  # type: ignore[operator]
    return {
        "device_read_bytes": d.read_bytes,
        "device_write_bytes": d.write_bytes,
        "write_amplification": d.write_bytes / (rows * row_bytes) if d.write_bytes else 0.0,
    }


def _read_phase(mm: np.memmap, name: str, batches: np.ndarray, cfg: StoreBenchConfig,
                progress: Progress) -> PhaseResult:
    update = progress(f"memmap {name}", len(batches))
    errors = 0
    seconds = cpu_s = 0.0
    io0 = read_proc_io()
    for ids in batches:
        with Stopwatch() as sw:
            out = mm[ids]  # fancy indexing copies the rows out
        seconds += sw.seconds
        cpu_s += sw.cpu_s
        errors += rows_mismatch(out, ids)
        update(1)
    rows = batches.size
    extra: dict = {"errors": errors, **_io_extra(io0, rows, cfg.row_bytes)}
    extra.pop("write_amplification", None)
    extra.pop("device_write_bytes", None)
    return PhaseResult("memmap", name, rows, seconds, cpu_s, extra)


def _write_phase(mm: np.memmap, name: str, batches: np.ndarray, cfg: StoreBenchConfig,
                 flush_each: bool, progress: Progress) -> PhaseResult:
    values = [make_rows(ids, cfg.row_width, 1 + i, cfg.seed) for i, ids in enumerate(batches)]
    update = progress(f"memmap {name}", len(batches))
    io0 = read_proc_io()
    with Stopwatch() as sw:
        for ids, rows in zip(batches, values, strict=True):
            mm[ids] = rows
            if flush_each:
                mm.flush()
            update(1)
        if not flush_each:
            mm.flush()
    n = batches.size
    extra = _io_extra(io0, n, cfg.row_bytes)
    extra.pop("device_read_bytes", None)
    errors = int(np.count_nonzero(np.asarray(mm[batches[-1]]) != values[-1]))
    return PhaseResult("memmap", name, n, sw.seconds, sw.cpu_s, {**extra, "errors": errors})


def run_memmap(cfg: StoreBenchConfig, work: IdWorkload, directory: Path,
               progress: Progress, log: Callable[[str], None]) -> dict[str, PhaseResult]:
    """Runs every phase of :data:`~benchmarks.lib.types.PHASES` on a memmap.

    Args:
        cfg: Benchmark settings.
        work: Ids of every phase.
        directory: Where the data file goes.
        progress: Progress-bar factory.
        log: Prints one line.

    Returns:
        Phase -> result; results carry ``cache_drop`` (how the page cache was dropped).
    """
    path = directory / "memmap_rows.f32"
    res: dict[str, PhaseResult] = {}
    try:
        mm = _open(path, cfg, "w+")
        update = progress("memmap load", cfg.rows)
        seconds = cpu_s = 0.0
        for lo in range(0, cfg.rows, cfg.batch):
            ids = np.arange(lo, min(cfg.rows, lo + cfg.batch), dtype=np.int64)
            rows = make_rows(ids, cfg.row_width, 0, cfg.seed)
            with Stopwatch() as sw:  # row generation is not timed
                mm[lo:lo + len(ids)] = rows
            seconds, cpu_s = seconds + sw.seconds, cpu_s + sw.cpu_s
            update(len(ids))
        with Stopwatch() as sw:
            mm.flush()
        res["load"] = PhaseResult("memmap", "load", cfg.rows, seconds + sw.seconds, cpu_s + sw.cpu_s)
        del mm

        method = drop_page_cache([path])
        mm = _open(path, cfg, "r+")
        res["read_cold_uniform"] = _read_phase(mm, "read_cold_uniform", work.uniform, cfg, progress)
        warm = np.repeat(work.uniform[-1:], max(cfg.warm_repeats, 1), axis=0)
        res["read_warm"] = _read_phase(mm, "read_warm", warm, cfg, progress)
        del mm
        method = drop_page_cache([path])
        mm = _open(path, cfg, "r+")
        res["read_cold_zipf"] = _read_phase(mm, "read_cold_zipf", work.zipf, cfg, progress)
        res["write_flush_each"] = _write_phase(mm, "write_flush_each", work.write_each, cfg, True, progress)
        res["write_flush_end"] = _write_phase(mm, "write_flush_end", work.write_end, cfg, False, progress)
        del mm
        for r in res.values():
            r.extra["cache_drop"] = method
            r.extra["madvise"] = cfg.memmap_madvise
        log(f"memmap: page cache dropped via {method}; madvise={cfg.memmap_madvise}; "
            "page cache not limited to the cache fraction")
        return res
    finally:
        if not cfg.keep:
            path.unlink(missing_ok=True)
