"""The block store's side of the store benchmark ("ours").

Load writes every row in batches (so later misses really hit the device, not the
lazy-init path), flushes and closes; every cold phase then reopens the table with
``BlockStore.open`` so the DRAM cache starts empty. Figures come from wall-clock and
process CPU time plus deltas of ``store.stats()``; ``/proc/self/io`` is read as a
cross-check of the store's own device-byte counters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.lib.common import (
    IdWorkload, Stopwatch, drop_page_cache, make_rows, read_proc_io, rows_mismatch,
)
from benchmarks.lib.types import BaselineUnavailable, PhaseResult, StoreBenchConfig

__all__ = ["import_store", "run_store"]

Progress = Callable[[str, int], Callable[[int], None]]

COUNTERS = ("rows_read", "rows_written", "cache_hits", "cache_misses", "lazy_init_rows",
            "device_bytes_read", "device_bytes_written", "device_reads", "device_writes",
            "gc_rows_moved")
"""Cumulative ``store.stats()`` keys reported as per-phase deltas."""

GAUGES = ("read_latency_p50_us", "read_latency_p99_us", "write_latency_p50_us",
          "write_latency_p99_us", "write_amplification")
"""``store.stats()`` keys reported as they are at the end of a phase."""


def import_store() -> Any:
    """The BlockStore class; BaselineUnavailable when the extension cannot be imported."""
    try:
        import torch  # noqa: F401
        from torchrec_mtrains.storage import BlockStore
    except ImportError as e:
        raise BaselineUnavailable(f"torchrec_mtrains.storage.BlockStore is not importable: {e}") from e
    return BlockStore


class _Phase:
    """Collects one phase's stats delta, times and ``/proc/self/io`` bytes.

    The phase time is the sum of the :meth:`timed` calls (row generation, verification
    and stats calls stay outside); the ``/proc/self/io`` bytes are summed over the same
    calls, so they cross-check the store's own ``device_bytes_*`` counters.
    """

    def __init__(self, store: Any, name: str) -> None:
        self.store = store
        self.name = name
        self.s0 = store.stats()
        self.seconds = 0.0
        self.cpu_s = 0.0
        self.proc_read = 0
        self.proc_write = 0
        self.last = Stopwatch()

    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs ``fn(*args)`` under the stopwatch and returns its result."""
        io0 = read_proc_io()
        with self.last:
            out = fn(*args)
        io1 = read_proc_io()
        self.seconds += self.last.seconds
        self.cpu_s += self.last.cpu_s
        if io0 is not None and io1 is not None:
            self.proc_read += (io1 - io0).read_bytes
            self.proc_write += (io1 - io0).write_bytes
        return out

    def result(self, rows: int, stats: Optional[dict[str, float]] = None, **extra: Any) -> PhaseResult:
        """The phase's figures; ``stats`` = the store's stats at the end (default: now)."""
        s1 = self.store.stats() if stats is None else stats
        d: dict[str, Any] = {k: s1[k] - self.s0[k] for k in COUNTERS if k in s1 and k in self.s0}
        d.update({k: s1[k] for k in GAUGES if k in s1})
        hits, misses = d.get("cache_hits", 0), d.get("cache_misses", 0)
        if hits + misses:
            d["hit_rate"] = hits / (hits + misses)
        d["proc_read_bytes"] = self.proc_read
        d["proc_write_bytes"] = self.proc_write
        d.update(extra)
        return PhaseResult("ours", self.name, rows, self.seconds, self.cpu_s, d)


def _read(store: Any, torch: Any, name: str, batches: np.ndarray, progress: Progress,
          reuse_out: bool = False) -> PhaseResult:
    """Reads each batch; times only the read calls (verification and stats are outside)."""
    ph = _Phase(store, name)
    tids = [torch.from_numpy(b) for b in batches]
    out = torch.empty(batches.shape[1], store.row_width, dtype=store.dtype) if reuse_out else None
    update = progress(f"ours {name}", len(batches))
    per_batch_hit: list[float] = []
    errors = 0
    best = float("inf")
    for ids, ids_np in zip(tids, batches, strict=True):
        s_before = store.stats()
        rows = ph.timed(store.read, ids, out)  # out=None: a new tensor per call
        best = min(best, ph.last.seconds)
        s_after = store.stats()
        h = s_after["cache_hits"] - s_before["cache_hits"]
        m = s_after["cache_misses"] - s_before["cache_misses"]
        per_batch_hit.append(h / (h + m) if h + m else float("nan"))
        errors += rows_mismatch(rows.numpy(), ids_np)
        if reuse_out and rows.data_ptr() != out.data_ptr():
            errors += 1  # read(out=) must fill and return the given buffer
        update(1)
    half = per_batch_hit[len(per_batch_hit) // 2:]
    return ph.result(
        batches.size, errors=errors, best_batch_rows_per_s=batches.shape[1] / best,
        steady_hit_rate=float(np.nanmean(half)) if half else float("nan"),
        per_batch_hit_rate=",".join(f"{x:.3f}" for x in per_batch_hit),
    )


def _write(store: Any, torch: Any, name: str, batches: np.ndarray, cfg: StoreBenchConfig,
           flush_each: bool, progress: Progress) -> PhaseResult:
    values = [torch.from_numpy(make_rows(ids, cfg.row_width, 1 + i, cfg.seed))
              for i, ids in enumerate(batches)]
    tids = [torch.from_numpy(b) for b in batches]
    ph = _Phase(store, name)
    update = progress(f"ours {name}", len(batches))
    for ids, rows in zip(tids, values, strict=True):
        ph.timed(store.write, ids, rows)
        if flush_each:
            ph.timed(store.flush)
        update(1)
    if not flush_each:
        ph.timed(store.flush)
    n = batches.size
    res = ph.result(n)
    dbw = res.extra.get("device_bytes_written")
    if dbw is not None:
        res.extra["write_amplification_phase"] = dbw / (n * cfg.row_bytes)
        res.extra["device_bytes_per_row"] = dbw / n
    back = store.read(tids[-1])
    res.extra["errors"] = int((back != values[-1]).any(dim=1).sum())
    return res


def _load(BlockStore: Any, torch: Any, cfg: StoreBenchConfig, path: Path, progress: Progress) -> PhaseResult:
    store = BlockStore(
        str(path), cfg.rows, cfg.dim, state_dim=cfg.state_dim, dtype=torch.float32,
        dram_cache_mb=cfg.cache_mb, direct_io=True, io_engine=cfg.io_engine,
        queue_depth=cfg.queue_depth, io_threads=cfg.io_threads, overwrite=True,
    )
    ph = _Phase(store, "load")
    update = progress("ours load", cfg.rows)
    for lo in range(0, cfg.rows, cfg.batch):
        ids = np.arange(lo, min(cfg.rows, lo + cfg.batch), dtype=np.int64)
        rows = torch.from_numpy(make_rows(ids, cfg.row_width, 0, cfg.seed))
        ph.timed(store.write, torch.from_numpy(ids), rows)  # row generation is not timed
        update(len(ids))
    ph.timed(store.flush)
    end_stats = store.stats()  # counters are gone once closed
    # Run the read path once before the page cache is dropped, so that its code pages
    # (libtorch, the extension) stay mapped and are not paged in during the cold phase.
    store.read(torch.arange(min(cfg.rows, 64)))
    engine = str(store.io_engine)
    store.close()
    return ph.result(cfg.rows, stats=end_stats, io_engine=engine)


def _verify_reopened(store: Any, torch: Any, work: IdWorkload, cfg: StoreBenchConfig) -> int:
    """Counts rows of the last batch of each write phase that a reopened store lost.

    A row of ``write_each`` rewritten later by ``write_end`` is checked against the
    later value only.
    """
    errors = 0
    none = np.empty(0, dtype=np.int64)
    checks = [(work.write_each[-1], len(work.write_each), work.write_end),  # version of the
              (work.write_end[-1], len(work.write_end), none)]             # last batch
    for ids, version, later in checks:
        keep = ~np.isin(ids, later)
        expect = make_rows(ids, cfg.row_width, version, cfg.seed)[keep]
        got = store.read(torch.from_numpy(ids[keep])).numpy()
        errors += int(np.count_nonzero((got != expect).any(axis=1)))
    return errors


def _open(BlockStore: Any, cfg: StoreBenchConfig, path: Path) -> Any:
    return BlockStore.open(str(path), dram_cache_mb=cfg.cache_mb, direct_io=True,
                           io_engine=cfg.io_engine, queue_depth=cfg.queue_depth,
                           io_threads=cfg.io_threads)


def run_store(cfg: StoreBenchConfig, work: IdWorkload, directory: Path, progress: Progress,
              log: Callable[[str], None]) -> dict[str, PhaseResult]:
    """Runs every phase of :data:`~benchmarks.lib.types.PHASES` on BlockStore.

    Args:
        cfg: Benchmark settings.
        work: Ids of every phase.
        directory: Where the table file goes.
        progress: Progress-bar factory.
        log: Prints one line.

    Returns:
        Phase -> result, plus "read_warm_out" (warm reads into a reused ``out=`` buffer).

    Raises:
        BaselineUnavailable: the store cannot be imported.
    """
    BlockStore = import_store()
    import torch

    path = directory / "blockstore.tbl"
    res: dict[str, PhaseResult] = {}
    store: Optional[Any] = None
    try:
        res["load"] = _load(BlockStore, torch, cfg, path, progress)
        method = drop_page_cache([path])
        store = _open(BlockStore, cfg, path)
        res["read_cold_uniform"] = _read(store, torch, "read_cold_uniform", work.uniform, progress)
        warm = np.repeat(work.uniform[-1:], max(cfg.warm_repeats, 1), axis=0)
        res["read_warm"] = _read(store, torch, "read_warm", warm, progress)
        res["read_warm_out"] = _read(store, torch, "read_warm_out", warm, progress, reuse_out=True)
        store.close()
        drop_page_cache([path])
        store = _open(BlockStore, cfg, path)
        res["read_cold_zipf"] = _read(store, torch, "read_cold_zipf", work.zipf, progress)
        res["write_flush_each"] = _write(store, torch, "write_flush_each", work.write_each, cfg, True, progress)
        res["write_flush_end"] = _write(store, torch, "write_flush_end", work.write_end, cfg, False, progress)
        io_engine = str(store.io_engine)
        store.close()
        store = _open(BlockStore, cfg, path)
        res["write_flush_end"].extra["reopen_errors"] = _verify_reopened(store, torch, work, cfg)
        store.close()
        store = None
        for r in res.values():
            r.extra["cache_drop"] = method
            r.extra.setdefault("io_engine", io_engine)
        log(f"ours: BlockStore io_engine={io_engine} queue_depth={cfg.queue_depth} "
            f"io_threads={cfg.io_threads} dram_cache={cfg.cache_mb:.1f} MiB")
        return res
    finally:
        if store is not None:
            store.close()
        if not cfg.keep:
            path.unlink(missing_ok=True)
