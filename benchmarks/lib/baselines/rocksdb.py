"""RocksDB baseline through its C++ API (``benchmarks/rocksdb/rocksdb_bench.cc``).

RocksDB is the engine behind FBGEMM's SSD embedding backend. The program is compiled
on demand with ``g++ -O2`` against the system librocksdb (Debian librocksdb-dev) into
``build/bench/`` and rebuilt when its source is newer than the binary. Each phase
runs in a fresh process, so every read phase starts with an empty block cache; with
``use_direct_reads`` the OS page cache does not serve SST data either.

Settings mirrored from the block store: block cache = the store's DRAM cache size,
MultiGet batches split over the same number of threads as the store's I/O threads,
4 KiB blocks, no compression, bloom filters (10 bits/key), direct reads and direct
flush/compaction I/O. Writes keep the WAL on: "write_flush_each" syncs the WAL on
every batch (WriteOptions.sync), "write_flush_end" syncs once at the end (SyncWAL),
like store.flush(). "read_warm_rowcache" repeats the warm phase with RocksDB's row
cache (of the DRAM cache size, in front of the block cache): a row-granular cache like
ours. Memtable flush + compaction after a write phase are timed
separately ("settle_s") and their bytes are counted in the write amplification.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import numpy as np

from benchmarks.lib.common import IdWorkload, drop_page_cache
from benchmarks.lib.types import BaselineUnavailable, PhaseResult, StoreBenchConfig

__all__ = ["build_binary", "run_rocksdb", "source_path"]

KEY_BYTES = 8
"""RocksDB keys are 8-byte big-endian row ids."""


def source_path() -> Optional[Path]:
    """The program's source in a repository checkout, or None when not in one."""
    src = Path(__file__).resolve().parents[3] / "benchmarks" / "rocksdb" / "rocksdb_bench.cc"
    return src if src.is_file() else None


def build_binary(src: Path, out_dir: Path) -> Path:
    """Compiles ``src`` into ``out_dir/rocksdb_bench`` unless an up-to-date binary exists.

    Raises:
        BaselineUnavailable: no g++, no RocksDB headers / library, or a compile error.
    """
    binary = out_dir / "rocksdb_bench"
    if binary.is_file() and binary.stat().st_mtime >= src.stat().st_mtime:
        return binary
    cxx = shutil.which("g++")
    if cxx is None:
        raise BaselineUnavailable("g++ is not installed")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    cmd = [cxx, "-O2", "-std=c++17", str(src), "-o", str(tmp), "-lrocksdb", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BaselineUnavailable(
            "cannot build the RocksDB baseline (apt-get install librocksdb-dev?): "
            + proc.stderr.strip()[-2000:]
        )
    tmp.replace(binary)
    return binary


def parse_results(stdout: str) -> dict[str, dict[str, float]]:
    """Parses ``RESULT phase=NAME k=v ...`` lines into {NAME: {k: v}}."""
    out: dict[str, dict[str, float]] = {}
    for line in stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        fields = dict(kv.split("=", 1) for kv in line.split()[1:])
        phase = fields.pop("phase")
        out[phase] = {k: float(v) for k, v in fields.items()}
    return out


class _Runner:
    """Runs the program's phases against one database directory."""

    def __init__(self, binary: Path, cfg: StoreBenchConfig, db: Path) -> None:
        self.binary = binary
        self.cfg = cfg
        self.db = db
        self.base = [
            str(binary), "--db", str(db), "--rows", str(cfg.rows),
            "--value-bytes", str(cfg.row_bytes), "--batch", str(cfg.batch),
            "--threads", str(cfg.reader_threads), "--block-cache-mb", f"{cfg.cache_mb:.6f}",
            "--direct-reads", "1", "--direct-io-flush", "1", "--seed", str(cfg.seed),
        ]

    def run(self, phase: str, ids: Optional[np.ndarray] = None, **opts: object) -> dict[str, dict[str, float]]:
        cmd = self.base + ["--phase", phase]
        if ids is not None:
            ids_file = self.db.parent / f"rocksdb_ids_{phase}.bin"
            np.ascontiguousarray(ids, dtype=np.int64).tofile(ids_file)
            cmd += ["--ids-file", str(ids_file)]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BaselineUnavailable(f"rocksdb_bench --phase {phase} failed: {proc.stderr.strip()}")
        return parse_results(proc.stdout)


def _result(phase: str, r: dict[str, float], keep: tuple[str, ...]) -> PhaseResult:
    extra = {k: r[k] for k in keep if k in r}
    return PhaseResult("rocksdb", phase, int(r["rows"]), r["seconds"], r.get("cpu_s"), extra)


def _read_result(phase: str, r: dict[str, float], cfg: StoreBenchConfig) -> PhaseResult:
    res = _result(phase, r, ("block_cache_hits", "block_cache_misses", "device_read_bytes",
                             "errors", "threads", "best_batch_rows_per_s", "row_cache_hits",
                             "row_cache_mb"))
    hits, misses = r.get("block_cache_hits", 0.0), r.get("block_cache_misses", 0.0)
    res.extra["block_cache_hit_rate"] = hits / (hits + misses) if hits + misses else 0.0
    res.extra["device_read_bytes_per_row"] = r.get("device_read_bytes", 0.0) / max(1, res.rows)
    return res


def _write_result(phase: str, run: dict[str, dict[str, float]], cfg: StoreBenchConfig) -> PhaseResult:
    w, s = run["write"], run.get("write_settle", {})
    res = _result(phase, w, ("device_write_bytes", "write_amplification", "rocksdb_bytes_written"))
    if s:
        res.extra["settle_s"] = s["seconds"]
        res.extra["rows_per_s_incl_settle"] = s["rows_per_s_incl_settle"]
        res.extra["device_write_bytes_incl_settle"] = s["device_write_bytes"]
        res.extra["write_amplification_incl_settle"] = s["write_amplification"]
    return res


def run_rocksdb(cfg: StoreBenchConfig, work: IdWorkload, directory: Path, build_dir: Path,
                log: Callable[[str], None]) -> dict[str, PhaseResult]:
    """Runs every phase of :data:`~benchmarks.lib.types.PHASES` on RocksDB.

    Args:
        cfg: Benchmark settings.
        work: Ids of every phase.
        directory: Where the database goes.
        build_dir: Where the program is compiled to.
        log: Prints one line.

    Returns:
        Phase -> result.

    Raises:
        BaselineUnavailable: the program cannot be built or run here.
    """
    src = source_path()
    if src is None:
        raise BaselineUnavailable("benchmarks/rocksdb/rocksdb_bench.cc not found (not a checkout)")
    binary = build_binary(src, build_dir)
    db = directory / "rocksdb"
    runner = _Runner(binary, cfg, db)
    res: dict[str, PhaseResult] = {}
    try:
        r = runner.run("load")["load"]
        res["load"] = _result("load", r, ("sst_bytes", "put_seconds"))
        method = drop_page_cache([db])
        r = runner.run("read", work.uniform, warm_repeats=cfg.warm_repeats)
        res["read_cold_uniform"] = _read_result("read_cold_uniform", r["read_cold"], cfg)
        if "read_warm" in r:
            res["read_warm"] = _read_result("read_warm", r["read_warm"], cfg)
        if cfg.warm_repeats > 0:
            # A stronger warm baseline: RocksDB's row cache (row granular, like our DRAM
            # cache) of the cache size, in front of the block cache of the same size.
            r = runner.run("read", work.uniform[-1:], warm_repeats=cfg.warm_repeats,
                           row_cache_mb=f"{cfg.cache_mb:.6f}")
            res["read_warm_rowcache"] = _read_result("read_warm_rowcache", r["read_warm"], cfg)
        drop_page_cache([db])
        r = runner.run("read", work.zipf, warm_repeats=0)
        res["read_cold_zipf"] = _read_result("read_cold_zipf", r["read_cold"], cfg)
        r = runner.run("write", work.write_each, sync_every_batch=1, settle=1)
        res["write_flush_each"] = _write_result("write_flush_each", r, cfg)
        r = runner.run("write", work.write_end, sync_every_batch=0, settle=1)
        res["write_flush_end"] = _write_result("write_flush_end", r, cfg)
        for v in res.values():
            v.extra["cache_drop"] = method
        log(f"rocksdb: {binary} ({cfg.reader_threads} MultiGet threads, block cache "
            f"{cfg.cache_mb:.1f} MiB, direct reads, WAL on)")
        return res
    finally:
        if not cfg.keep:
            shutil.rmtree(db, ignore_errors=True)
            for f in directory.glob("rocksdb_ids_*.bin"):
                f.unlink(missing_ok=True)
