"""Block-store benchmark: BlockStore side by side with its baselines.

Runs, in one process and on one filesystem: fio's device limits, the block store
("ours"), RocksDB through its C++ API, and numpy.memmap, over the same rows and the
same ids, then prints rows/s per phase, the ratios and the benchmark's targets
(PASS/MISS). Defaults come from ``benchmarks/configs/store.yaml``; CLI flags override
it; ``--quick`` applies the config's ``quick:`` overlay (flags still win).

Usage::

    python benchmarks/bench_store.py [--quick] [--json out.json] [...]
    mtrains bench store [...]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from benchmarks.lib import settings
from benchmarks.lib.cold_case import CASE, run_cold_case
from benchmarks.lib.common import check_filesystem, drop_page_cache, make_workload
from benchmarks.lib.report import Results, format_report, write_json
from benchmarks.lib.types import BaselineUnavailable, StoreBenchConfig

__all__ = ["load_config", "main", "parse_args"]

REPO_ROOT = settings.REPO_ROOT

DEFAULT_CONFIG = REPO_ROOT / "benchmarks" / "configs" / "store.yaml"

_FLAGS: list[tuple[str, type, str]] = [
    ("rows", int, "rows of the table"),
    ("dim", int, "float32 weights per row"),
    ("state_dim", int, "float32 optimizer-state values per row"),
    ("batch", int, "rows per batched read/write call"),
    ("batches", int, "batches of the cold uniform read phase"),
    ("zipf_batches", int, "batches of the cold Zipf read phase"),
    ("write_batches", int, "batches of each write phase"),
    ("warm_repeats", int, "re-reads of the last uniform batch (warm phase)"),
    ("cache_fraction", float, "DRAM cache / RocksDB block cache as a share of the table bytes"),
    ("dir", Path, "data directory on the filesystem under test (not tmpfs)"),
    ("queue_depth", int, "I/O queue depth of the store and of fio's random reads"),
    ("io_threads", int, "I/O threads of the store (and RocksDB MultiGet threads)"),
    ("rocksdb_threads", int, "RocksDB MultiGet threads (default: --io-threads)"),
    ("io_engine", str, "store I/O engine: auto | uring | threads"),
    ("zipf_alpha", float, "Zipf exponent of the skewed reads"),
    ("seed", int, "seed of ids and row values"),
    ("fio_runtime_s", float, "seconds per fio job"),
    ("fio_size_mb", int, "fio test file size in MiB"),
    ("memmap_madvise", str, "memmap readahead advice: random | normal"),
    ("case", str, "what runs: main (every system, every phase) | cold_uniform_32k (one cold "
                  "read call of the store vs fio, alternated) | all"),
    ("case_rows", int, "rows of the cold_uniform_32k table"),
    ("case_batch", int, "ids of the cold_uniform_32k read call"),
    ("case_repeats", int, "fio / read alternations of cold_uniform_32k (ratio: their median)"),
    ("case_fio_runtime_s", float, "seconds per fio run of cold_uniform_32k"),
]
_SWITCHES = ("skip_rocksdb", "skip_fio", "skip_memmap", "skip_ours", "keep", "quick")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parses flags; options not given are absent from the namespace (config decides)."""
    p = argparse.ArgumentParser(
        prog="mtrains bench store", description=__doc__.split("\n\n")[1],
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", type=Path, help=f"YAML config (default {DEFAULT_CONFIG})")
    for name, typ, help_ in _FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=help_)
    p.add_argument("--json", dest="json_path", type=Path, help="write every figure to this JSON file")
    for name in _SWITCHES:
        p.add_argument("--" + name.replace("_", "-"), dest=name, action="store_true",
                       help={"quick": "small run (the config's quick: overlay), well under a minute",
                             "keep": "keep data files"}.get(name, f"do not run the {name[5:]} side"))
    return p.parse_args(argv)


def load_config(path: Optional[Path], quick: bool) -> dict[str, Any]:
    """Reads the YAML config (top level, then its ``quick:`` section when ``quick``).

    Raises:
        ValueError: unknown keys or a malformed file.
    """
    return settings.load_config(path, DEFAULT_CONFIG, quick, StoreBenchConfig)


def build_config(argv: Optional[Sequence[str]]) -> StoreBenchConfig:
    """Dataclass defaults < config file < config's quick overlay < CLI flags."""
    return settings.build_config(parse_args(argv), DEFAULT_CONFIG, StoreBenchConfig)


def run(cfg: StoreBenchConfig,
        log: Callable[[str], None] = print) -> tuple[Results, dict[str, str], list[str], dict]:
    """Runs every enabled system; returns (results, skipped reasons, header lines, meta)."""
    from benchmarks.lib.baselines import fio, memmap, rocksdb
    from benchmarks.lib.blockstore import run_store

    if cfg.dir is None:
        raise ValueError("dir must be set (build_config fills in the default)")
    cfg.dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="mtrains-bench-store-", dir=cfg.dir))
    main_bytes = 4 * cfg.table_bytes if cfg.case in ("main", "all") else 0
    case_bytes = 2 * cfg.case_rows * cfg.row_bytes if cfg.case in (CASE, "all") else 0
    fs = check_filesystem(work_dir, need_bytes=max(main_bytes, case_bytes) + cfg.fio_size_mb * 2**20)
    meta = {"fs": dataclasses.asdict(fs), "work_dir": str(work_dir), **settings.tool_versions(),
            "cache_drop": drop_page_cache([])}
    header = [
        f"store benchmark: {cfg.rows:,} rows x ({cfg.dim}+{cfg.state_dim}) fp32 = {cfg.row_bytes} B/row, "
        f"table {cfg.table_bytes / 2**20:,.1f} MiB; cache {cfg.cache_mb:,.1f} MiB ({cfg.cache_fraction:.1%}); "
        f"batch {cfg.batch:,}; QD {cfg.queue_depth}; io_threads {cfg.io_threads}; "
        f"rocksdb threads {cfg.reader_threads}",
        f"dir {work_dir} ({fs.fs_type} on {fs.device}{', IN MEMORY' if fs.in_memory else ''}); "
        f"page cache dropped via {meta['cache_drop']}; {meta['cpus']} CPUs; kernel {meta['kernel']}; "
        f"rocksdb {meta.get('rocksdb', '?')}; {meta.get('fio', 'fio ?')}",
    ]
    if cfg.case in (CASE, "all"):
        header.append(
            f"{CASE}: {cfg.case_rows:,} rows ({cfg.case_rows * cfg.row_bytes / 2**20:,.1f} MiB), one read "
            f"call of {cfg.case_batch:,} uniform ids, DRAM cache off, QD {cfg.queue_depth}; "
            f"{cfg.case_repeats} reads alternated with fio runs of {cfg.case_fio_runtime_s:g} s")
    work = make_workload(cfg.rows, cfg.batch, cfg.batches, cfg.zipf_batches, cfg.write_batches,
                         cfg.zipf_alpha, cfg.seed)
    progress = settings.progress_factory()
    res: Results = {}
    skipped: dict[str, str] = {}
    steps: list[tuple[str, bool, Callable[[], Any]]] = [
        ("fio", cfg.skip_fio, lambda: fio.run_fio(work_dir, fio.default_jobs(cfg.queue_depth),
                                                  cfg.fio_size_mb, cfg.fio_runtime_s, cfg.keep)),
        ("ours", cfg.skip_ours, lambda: run_store(cfg, work, work_dir, progress, log)),
        # The device's speed drifts (shared / virtual disks): measure its read limit again
        # right after our phases; the read target uses the mean of both fio runs.
        ("fio", cfg.skip_fio or cfg.skip_ours, lambda: {**res.get("fio", {}), **fio.run_fio(
            work_dir, [fio.FioJob("randread_4k_qd32_after", "randread", 4096, 32)],
            cfg.fio_size_mb, cfg.fio_runtime_s, cfg.keep)}),
        ("rocksdb", cfg.skip_rocksdb, lambda: rocksdb.run_rocksdb(
            cfg, work, work_dir, REPO_ROOT / "build" / "bench", log)),
        ("memmap", cfg.skip_memmap, lambda: memmap.run_memmap(cfg, work, work_dir, progress, log)),
    ]
    if cfg.case == CASE:
        steps = []
    try:
        for system, skip, step in steps:
            if skip:
                skipped.setdefault(system, "disabled by --skip-" + system)
                continue
            if system in skipped:  # a second step of a system that could not run
                continue
            log(f"running {system} ...")
            try:
                res[system] = step()
            except BaselineUnavailable as e:
                skipped[system] = str(e)
                log(f"SKIPPED {system}: {e}")
        if cfg.case in (CASE, "all"):
            _run_case(cfg, work_dir, progress, log, res, skipped)
    finally:
        if not cfg.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    return res, skipped, header, meta


def _run_case(cfg: StoreBenchConfig, work_dir: Path, progress: Any, log: Callable[[str], None],
              res: Results, skipped: dict[str, str]) -> None:
    """Runs the cold_uniform_32k case into ``res`` (its reasons to skip into ``skipped``)."""
    from benchmarks.lib.blockstore import import_store

    if cfg.skip_ours:
        skipped.setdefault(CASE, "disabled by --skip-ours")
        return
    log(f"running {CASE} ...")
    try:
        figures, fio_skip = run_cold_case(import_store(), cfg, work_dir, progress, log)
    except BaselineUnavailable as e:
        skipped[CASE] = str(e)
        log(f"SKIPPED {CASE}: {e}")
        return
    for system, phases in figures.items():
        res.setdefault(system, {}).update(phases)
    if fio_skip is not None or cfg.skip_fio:
        skipped[CASE + " fio"] = fio_skip or "disabled by --skip-fio"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``mtrains bench store`` and ``benchmarks/bench_store.py``.

    Returns:
        0; 1 when a system returned wrong rows (verification errors); 2 for a bad
        flag or config value.
    """
    try:
        cfg = build_config(argv)
    except ValueError as e:  # a bad flag or config value: a usage error, no traceback
        print(f"mtrains bench store: error: {e}", file=sys.stderr)
        return 2
    res, skipped, header, meta = run(cfg)
    print()
    print(format_report(res, cfg, header, skipped))
    if cfg.json_path is not None:
        write_json(cfg.json_path, res, cfg, meta, skipped)
        print(f"figures written to {cfg.json_path}")
    bad = any(r.extra.get(k) for ph in res.values() for r in ph.values()
              for k in ("errors", "reopen_errors"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
