"""Kernel benchmark: TieredEmbeddingBags side by side with FBGEMM all in DRAM.

Trains one table (default 4M rows x 128 fp32, batch 8192 x pooling 20, Zipf ids) with
FBGEMM's CPU TBE holding the whole table in DRAM (the baseline) and with
TieredEmbeddingBags on the SCM tier (a memory-mapped file) and the SSD tier (the block
store, every row written first), both with a 10% row cache; measures fio's device limits
in the same run; reports the cache policies' hit rates next to Belady's optimum on the same
trace, and compares every policy (replaying the cache index alone) on the i.i.d. Zipf trace
and on a drifting one (``benchmarks/lib/kernel_policies.py``); prints the benchmark's
targets (PASS/MISS). Defaults come from
``benchmarks/configs/kernel.yaml``; CLI flags override it; ``--quick`` applies the config's
``quick:`` overlay (flags still win).

Usage::

    python benchmarks/bench_kernel.py [--quick] [--json out.json] [...]
    python benchmarks/bench_kernel.py --policies-only [--quick]   # the policy comparison alone
    mtrains bench kernel [...]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from benchmarks.lib import settings
from benchmarks.lib.common import check_filesystem
from benchmarks.lib.report import Results
from benchmarks.lib.types import BaselineUnavailable, KernelBenchConfig, PhaseResult

__all__ = ["build_config", "load_config", "main", "parse_args", "run"]

DEFAULT_CONFIG = settings.REPO_ROOT / "benchmarks" / "configs" / "kernel.yaml"

_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    ("rows", int, "rows of the table"),
    ("dim", int, "fp32 weights per row"),
    ("batch", int, "bags per step"),
    ("pooling", int, "ids per bag"),
    ("zipf_alpha", float, "Zipf exponent of the main workload (SCM and SSD runs)"),
    ("high_locality_alpha", float, "Zipf exponent of the high-locality SSD run"),
    ("cache_load_factor", float, "row cache as a share of the table's rows"),
    ("cache_algorithm", str, "cache policy of the throughput runs: lru | lfu | tinylfu"),
    ("policies", str, "comma-separated policies whose hit rates are compared with Belady's"),
    ("drift", float, "share of the Zipf ranks moving to fresh ids per step (drifting trace)"),
    ("learning_rate", float, "learning rate of both systems"),
    ("warmup_steps", int, "steps before the first measured block"),
    ("high_locality_warmup_steps", int, "warm-up steps of the high-locality table"),
    ("blocks", int, "measured blocks per system (baseline and ours alternate)"),
    ("block_steps", int, "steps per measured block"),
    ("fill_chunk_rows", int, "rows per set_rows call when writing a whole table first"),
    ("dir", Path, "data directory on the filesystem under test (not tmpfs)"),
    ("seed", int, "seed of the ids and row values"),
    ("fio_runtime_s", float, "seconds per fio job"),
    ("fio_size_mb", int, "fio test file size in MiB"),
]
_SWITCHES = {
    "skip_fio": "do not run fio (no device-time target)",
    "skip_scm": "do not run the SCM tier",
    "skip_ssd": "do not run the SSD tier (Zipf alpha workload)",
    "skip_high_locality": "do not run the high-locality SSD table",
    "skip_policies": "do not run the extra cache policies (hit rates) nor the policy comparison",
    "policies_only": "only the policy comparison (every policy, cache-index replay; no fio, no TBE runs)",
    "skip_belady": "do not compute Belady's optimal hit rate",
    "no_fill_scm": "do not write the SCM table first (misses read lazily initialised rows)",
    "keep": "keep data files",
    "sequence": "unpooled lookups on both systems (PoolingMode.NONE: EmbeddingCollection's sequences)",
    "quick": "small run (the config's quick: overlay), about a minute",
}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parses flags; options not given are absent from the namespace (config decides)."""
    p = argparse.ArgumentParser(
        prog="mtrains bench kernel", description=__doc__.split("\n\n")[1],
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", type=Path, help=f"YAML config (default {DEFAULT_CONFIG})")
    for name, typ, help_ in _FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help=help_)
    p.add_argument("--json", dest="json_path", type=Path, help="write every figure to this JSON file")
    for name, help_ in _SWITCHES.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, action="store_true", help=help_)
    ns = p.parse_args(argv)
    if getattr(ns, "no_fill_scm", False):
        ns.fill_scm = False
    if hasattr(ns, "no_fill_scm"):
        del ns.no_fill_scm
    return ns


def load_config(path: Optional[Path], quick: bool) -> dict[str, Any]:
    """Reads the YAML config (top level, then its ``quick:`` section when ``quick``).

    Raises:
        ValueError: unknown keys or a malformed file.
    """
    return settings.load_config(path, DEFAULT_CONFIG, quick, KernelBenchConfig)


def build_config(argv: Optional[Sequence[str]]) -> KernelBenchConfig:
    """Dataclass defaults < config file < config's quick overlay < CLI flags."""
    return settings.build_config(parse_args(argv), DEFAULT_CONFIG, KernelBenchConfig)


def _store_queue_depth() -> int:
    """I/O queue depth of the block store TieredEmbeddingBags creates (its default)."""
    from torchrec_mtrains.storage.block_store import StoreRuntimeConfig

    return StoreRuntimeConfig().queue_depth


class _Runner:
    """One benchmark run: its work directory, results and the shared baseline."""

    def __init__(self, cfg: KernelBenchConfig, work_dir: Path, log: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.work_dir = work_dir
        self.log = log
        self.res: Results = {}
        self.skipped: dict[str, str] = {}
        self.progress = settings.progress_factory()
        self.baseline: Any = None
        self.queue_depth = _store_queue_depth()

    def add(self, r: Optional[PhaseResult]) -> None:
        if r is not None:
            self.res.setdefault(r.system, {})[r.phase] = r

    def fio(self, jobs: list[Any]) -> None:
        from benchmarks.lib.baselines import fio

        if self.cfg.skip_fio:
            self.skipped.setdefault("fio", "disabled by --skip-fio")
            return
        if "fio" in self.skipped:
            return
        self.log(f"running fio ({', '.join(j.name for j in jobs)}) ...")
        try:
            out = fio.run_fio(self.work_dir, jobs, self.cfg.fio_size_mb, self.cfg.fio_runtime_s, self.cfg.keep)
        except BaselineUnavailable as e:
            self.skipped["fio"] = str(e)
            self.log(f"SKIPPED fio: {e}")
            return
        for r in out.values():
            self.add(r)

    def tiered(self, phase: str, tier: str, policy: str, batches: Any, fill: bool,
               with_baseline: bool) -> None:
        from benchmarks.lib import kernel_steps as ks

        if with_baseline and self.baseline is None:
            self.log("building the FBGEMM baseline (table in DRAM, every page touched) ...")
            self.baseline = ks.make_fbgemm(self.cfg)
        storage = self.work_dir / phase
        self.log(f"running {phase}: {tier}, Zipf {batches.alpha}, {policy}"
                 f"{', writing every row first' if fill else ''} ...")
        run = ks.make_tiered(self.cfg, tier, policy, storage, fill, self.progress)
        if fill:
            self.log(f"  filled {run.fill_rows:,} rows in {run.fill_seconds:.1f} s")
            if tier == "SCM":
                t0 = time.perf_counter()
                os.sync()  # the kernel's background write-back of the fill stays out of the timing
                self.log(f"  sync after fill: {time.perf_counter() - t0:.1f} s")
        out = ks.run_side_by_side(self.cfg, phase, run, batches, self.baseline if with_baseline else None,
                                  self.progress, self.log)
        out.ours.extra["close_seconds"] = ks.close_quietly(run)
        self.add(out.ours)
        self.add(out.baseline)
        del run
        gc.collect()
        if not self.cfg.keep:
            shutil.rmtree(storage, ignore_errors=True)

    def references(self, key: str, batches: Any, capacities: list[float]) -> None:
        """Belady's optimum, exact fully associative LRU and the best static cache (the
        most probable rows) on the workload's trace, counted over the measured steps."""
        from benchmarks.lib.belady import belady_hits, lru_hits, static_hits

        cfg = self.cfg
        nominal = _cache_rows(cfg)
        capacity = int(max([nominal] + [c for c in capacities if c == c]))
        steps, w = batches.step_ids(), batches.warmup
        self.log(f"reference hit rates on the Zipf {batches.alpha} trace ({len(steps)} steps, "
                 f"capacity {capacity:,}) ...")
        t0 = time.perf_counter()
        opt = belady_hits(steps, capacity, w)
        extra: dict[str, Any] = {
            "hit_rate": opt.hit_rate, "hits": opt.hits, "capacity": capacity, "capacity_nominal": nominal,
            "counted_from_step": w, "steps": len(steps), "zipf_alpha": batches.alpha,
            "lru_full_assoc_hit_rate": lru_hits(steps, capacity, w).hit_rate,
            "static_top_hit_rate": static_hits(steps, batches.order[:capacity], w).hit_rate,
        }
        if capacity != nominal:
            extra["hit_rate_nominal"] = belady_hits(steps, nominal, w).hit_rate
        self.add(PhaseResult("belady", key, opt.accesses, time.perf_counter() - t0, None, extra))


def _compare_policies(r: _Runner, batches: Any) -> None:
    """Every policy on the i.i.d. Zipf and the drifting trace (cache-index replay)."""
    from benchmarks.lib.kernel_policies import compare_policies

    for x in compare_policies(r.cfg, batches.step_ids(), batches.order, r.log):
        r.add(x)


def _cache_rows(cfg: KernelBenchConfig) -> int:
    """Cache rows of the kernel: ceil(rows x cache_load_factor), as TieredEmbeddingBags sizes it."""
    return max(1, math.ceil(cfg.rows * cfg.cache_load_factor))


def _header(cfg: KernelBenchConfig, work_dir: Path, fs: Any, meta: dict[str, Any]) -> list[str]:
    return [
        f"kernel benchmark: {cfg.rows:,} rows x {cfg.dim} fp32 ({cfg.table_bytes / 2**30:.2f} GiB per copy), "
        f"EXACT_ROWWISE_ADAGRAD lr {cfg.learning_rate:g}; batch {cfg.batch:,} x "
        f"{'sequences of' if cfg.sequence else 'pooling'} {cfg.pooling} = "
        f"{cfg.lookups_per_step:,} lookups/step; Zipf {cfg.zipf_alpha} (high locality {cfg.high_locality_alpha}); "
        f"cache {cfg.cache_load_factor:.0%} = {_cache_rows(cfg):,} rows",
        f"protocol: distinct batches, the same for every system: {cfg.warmup_steps} warm-up steps "
        f"({cfg.high_locality_warmup_steps} for the high-locality table), then {cfg.blocks} blocks x "
        f"{cfg.block_steps} steps with FBGEMM and ours alternating; compared: median step times",
        f"dir {work_dir} ({fs.fs_type} on {fs.device}{', IN MEMORY' if fs.in_memory else ''}); "
        f"{meta['cpus']} CPUs, torch threads {meta['torch_threads']}; kernel {meta['kernel']}; "
        f"{meta.get('fio', 'fio ?')}; block store queue depth {meta['store_queue_depth']}",
    ]


def _run_parts(r: _Runner) -> None:
    """fio, SSD (+ fio's read limit again), SSD high locality, SCM, the other policies, and
    the reference hit rates, in that order (SCM last: its mmap's page-cache write-back must
    not run while the SSD is measured)."""
    from benchmarks.lib import kernel_steps as ks
    from benchmarks.lib.baselines.fio import FioJob
    from benchmarks.lib.types import MIB

    cfg, qd, log = r.cfg, r.queue_depth, r.log
    measured = cfg.blocks * cfg.block_steps
    read_job = FioJob(f"randread_4k_qd{qd}", "randread", 4096, qd)
    log(f"generating {cfg.warmup_steps + measured} batches of Zipf {cfg.zipf_alpha} ids ...")
    main_batches = ks.make_batches(cfg, cfg.zipf_alpha, cfg.seed, cfg.warmup_steps)
    if not cfg.skip_policies:
        _compare_policies(r, main_batches)
    if cfg.policies_only:
        return
    r.fio([read_job, FioJob(f"randwrite_4k_qd{qd}", "randwrite", 4096, qd),
           FioJob("write_1m_seq", "write", MIB, 8)])
    if not cfg.skip_ssd:
        r.tiered("ssd", "SSD", cfg.cache_algorithm, main_batches, fill=True, with_baseline=True)
        # The device's speed drifts (shared / virtual disks): read limit again right after.
        r.fio([dataclasses.replace(read_job, name=read_job.name + "_after")])
    hl = None
    if not cfg.skip_high_locality:
        log(f"generating {cfg.high_locality_warmup_steps + measured} batches of Zipf "
            f"{cfg.high_locality_alpha} ids ...")
        hl = ks.make_batches(cfg, cfg.high_locality_alpha, cfg.seed + 1, cfg.high_locality_warmup_steps)
        r.tiered("ssd_high_locality", "SSD", cfg.cache_algorithm, hl, fill=True, with_baseline=True)
    if not cfg.skip_scm:
        r.tiered("scm", "SCM", cfg.cache_algorithm, main_batches, fill=cfg.fill_scm, with_baseline=True)
    r.baseline = None  # frees its 2 GB before the policy runs
    gc.collect()
    ours = r.res.get("ours", {})
    if not cfg.skip_policies:
        done = {str(x.extra["cache_algorithm"]) for x in ours.values()
                if x.extra["zipf_alpha"] == cfg.zipf_alpha}
        for policy in cfg.policies:
            if policy not in done:
                r.tiered(f"scm_{policy}", "SCM", policy, main_batches, fill=cfg.fill_scm, with_baseline=False)
    if cfg.skip_belady:
        return
    caps = [float(x.extra["cache_capacity_rows"]) for x in ours.values()
            if x.extra["zipf_alpha"] == cfg.zipf_alpha]
    if caps:
        r.references("zipf", main_batches, caps)
    if hl is not None and "ssd_high_locality" in ours:
        r.references("high_locality", hl, [float(ours["ssd_high_locality"].extra["cache_capacity_rows"])])


def run(cfg: KernelBenchConfig,
        log: Callable[[str], None] = print) -> tuple[Results, dict[str, str], list[str], dict, list[str]]:
    """Runs every enabled part; returns (results, skipped, header lines, meta, noise lines)."""
    import torch

    from benchmarks.lib.kernel_report import noise_lines
    from benchmarks.lib.types import MIB

    if cfg.dir is None:
        raise ValueError("dir must be set (build_config fills in the default)")
    load_before = os.getloadavg()
    cfg.dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="mtrains-bench-kernel-", dir=cfg.dir))
    need = 0 if cfg.policies_only else 4 * cfg.rows * cfg.row_bytes + cfg.fio_size_mb * MIB
    fs = check_filesystem(work_dir, need_bytes=need)
    r = _Runner(cfg, work_dir, log)
    meta: dict[str, Any] = {"fs": dataclasses.asdict(fs), "work_dir": str(work_dir), **settings.tool_versions(),
                            "torch_threads": torch.get_num_threads(), "store_queue_depth": r.queue_depth}
    try:
        _run_parts(r)
    finally:
        if not cfg.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    meta["loadavg_before"], meta["loadavg_after"] = load_before, os.getloadavg()
    noise = noise_lines(r.res, load_before, meta["loadavg_after"])
    return r.res, r.skipped, _header(cfg, work_dir, fs, meta), meta, noise


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``mtrains bench kernel`` and ``benchmarks/bench_kernel.py``.

    Returns:
        0; 2 for a bad flag or config value.
    """
    from benchmarks.lib.kernel_report import format_report, write_json

    try:
        cfg = build_config(argv)
    except ValueError as e:  # a bad flag or config value: a usage error, no traceback
        print(f"mtrains bench kernel: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res, skipped, header, meta, noise = run(cfg)
    meta["wall_seconds"] = time.perf_counter() - t0
    print()
    print(format_report(res, cfg, header, skipped, noise))
    print(f"wall time {meta['wall_seconds']:.0f} s")
    if cfg.json_path is not None:
        write_json(cfg.json_path, res, cfg, meta, skipped)
        print(f"figures written to {cfg.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
