"""Results table, target checks and JSON output of the store benchmark."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from benchmarks.lib.cold_case import CASE, GOAL
from benchmarks.lib.types import PhaseResult, StoreBenchConfig

__all__ = ["Target", "evaluate_targets", "fio_lines", "format_report", "write_json"]

Results = dict[str, dict[str, PhaseResult]]
"""system ("ours", "rocksdb", "memmap", "fio") -> phase -> result."""

TABLE_ROWS: tuple[tuple[str, str, str, str], ...] = (
    # (label, ours phase, rocksdb phase, memmap phase)
    ("load", "load", "load", "load"),
    ("read_cold_uniform", "read_cold_uniform", "read_cold_uniform", "read_cold_uniform"),
    ("read_cold_zipf", "read_cold_zipf", "read_cold_zipf", "read_cold_zipf"),
    ("read_warm", "read_warm", "read_warm", "read_warm"),
    ("read_warm_out", "read_warm_out", "read_warm", "read_warm"),
    ("warm_vs_rowcache", "read_warm", "read_warm_rowcache", ""),
    ("write_flush_each", "write_flush_each", "write_flush_each", "write_flush_each"),
    ("write_flush_end", "write_flush_end", "write_flush_end", "write_flush_end"),
)
"""Rows of the results table."""

TABLE_PHASES = tuple(dict.fromkeys(row[1] for row in TABLE_ROWS))


@dataclass(frozen=True)
class Target:
    """One target of the store benchmark and how this run did against it.

    Attributes:
        name: What is compared, e.g. "cold uniform reads >= 1.5x RocksDB".
        status: "PASS", "MISS", "SKIP" (a side was not measured) or "INFO" (report only).
        detail: The figures behind the status.
        ratio: Measured ratio (ours / reference), or None.
        goal: Ratio needed to pass, or None.
    """

    name: str
    status: str
    detail: str
    ratio: Optional[float] = None
    goal: Optional[float] = None


def _rate(res: Results, system: str, phase: str) -> Optional[float]:
    r = res.get(system, {}).get(phase)
    return r.rows_per_s if r is not None else None


def _ratio_target(name: str, ours: Optional[float], ref: Optional[float], goal: float,
                  ref_label: str) -> Target:
    if ours is None or ref is None or not ref:
        missing = "ours" if ours is None else ref_label
        return Target(name, "SKIP", f"{missing} not measured")
    ratio = ours / ref
    status = "PASS" if ratio >= goal else "MISS"
    detail = f"{ours:,.0f} vs {ref:,.0f} rows/s = {ratio:.2f}x (goal {goal:g}x)"
    return Target(name, status, detail, ratio, goal)


def _fio_read_iops(res: Results) -> Optional[float]:
    """fio's 4 KiB random-read IOPS at QD 32: the mean of the runs before and after ours."""
    runs = [r.rows_per_s for k, r in res.get("fio", {}).items() if k.startswith("randread_4k_qd32")]
    return sum(runs) / len(runs) if runs else None


def _case_target(res: Results) -> Optional[Target]:
    """The cold_uniform_32k case against fio (None when the case did not run)."""
    r = res.get("ours", {}).get(CASE)
    if r is None:
        return None
    x = r.extra
    name = (f"{CASE}: one cold read call of {int(x['batch']):,} uniform ids, "
            f"{int(x['table_rows']):,}-row table, DRAM cache off >= {GOAL:g}x fio 4 KiB randread "
            f"IOPS at QD 32 (median over reads, each vs the fio runs around it)")
    if "ratio_to_fio" not in x:
        return Target(name, "SKIP", "fio not measured")
    ratio = float(x["ratio_to_fio"])
    detail = (f"{ratio:.2f}x (goal {GOAL:g}x); ratios {x['ratios']}; ours rows/s {x['rows_per_s_each']}; "
              f"fio IOPS {x['fio_iops_each']}")
    return Target(name, "PASS" if ratio >= GOAL else "MISS", detail, ratio, GOAL)


def evaluate_targets(res: Results, cfg: StoreBenchConfig) -> list[Target]:
    """Checks the store benchmark's targets against this run's figures."""
    case = _case_target(res)
    if cfg.case == CASE:  # the case alone: the main run's targets were not measured
        return [case] if case is not None else []
    fio_iops = _fio_read_iops(res)
    t = [
        _ratio_target("cold uniform reads >= 80% of fio 4 KiB randread IOPS at QD 32",
                      _rate(res, "ours", "read_cold_uniform"), fio_iops, 0.8, "fio"),
        _ratio_target("cold uniform reads >= 1.5x RocksDB (C++ MultiGet)",
                      _rate(res, "ours", "read_cold_uniform"), _rate(res, "rocksdb", "read_cold_uniform"),
                      1.5, "rocksdb"),
        _ratio_target("warm reads (DRAM cache) >= 10x RocksDB warm reads",
                      _rate(res, "ours", "read_warm"), _rate(res, "rocksdb", "read_warm"), 10.0, "rocksdb"),
        _ratio_target("  (extra) warm reads >= 10x RocksDB warm reads with a row cache of the same size",
                      _rate(res, "ours", "read_warm"), _rate(res, "rocksdb", "read_warm_rowcache"),
                      10.0, "rocksdb"),
        _ratio_target("write-back, flush per batch >= 1x RocksDB WriteBatch+sync",
                      _rate(res, "ours", "write_flush_each"), _rate(res, "rocksdb", "write_flush_each"),
                      1.0, "rocksdb"),
        _ratio_target("  (aim) write-back, flush per batch >= 2x RocksDB",
                      _rate(res, "ours", "write_flush_each"), _rate(res, "rocksdb", "write_flush_each"),
                      2.0, "rocksdb"),
        _ratio_target("write-back, one flush at the end >= 1x RocksDB (one SyncWAL)",
                      _rate(res, "ours", "write_flush_end"), _rate(res, "rocksdb", "write_flush_end"),
                      1.0, "rocksdb"),
    ]
    if case is not None:
        t.insert(1, case)
    cold = res.get("ours", {}).get("read_cold_uniform")
    if cold is not None and fio_iops and "device_reads" in cold.extra:
        reads_per_s = float(cold.extra["device_reads"]) / cold.seconds
        t.append(Target("device reads/s of ours during cold uniform reads vs fio (no help from "
                        "cache hits or rows sharing a block)", "INFO",
                        f"{reads_per_s:,.0f} vs {fio_iops:,.0f} IOPS = {reads_per_s / fio_iops:.2f}x"))
    for phase in ("write_flush_each", "write_flush_end"):
        parts = []
        for system, key in (("ours", "write_amplification_phase"), ("rocksdb", "write_amplification"),
                            ("memmap", "write_amplification")):
            r = res.get(system, {}).get(phase)
            if r is not None and key in r.extra:
                s = f"{system} {float(r.extra[key]):.2f}"
                if system == "rocksdb" and "write_amplification_incl_settle" in r.extra:
                    settled = float(r.extra["write_amplification_incl_settle"])
                    s += f" ({settled:.2f} incl. memtable flush + compaction)"
                parts.append(s)
        t.append(Target(f"write amplification, {phase} (device bytes / payload bytes)", "INFO",
                        "; ".join(parts) or "not measured"))
    ours = res.get("ours", {})
    cpu = [f"{p} {ours[p].cpu_us_per_row:.2f}" for p in TABLE_PHASES
           if p in ours and ours[p].cpu_us_per_row is not None]
    t.append(Target("store CPU per row (us, process CPU incl. I/O threads)", "INFO",
                    ", ".join(cpu) or "not measured"))
    return t


def _fmt(x: Optional[float], spec: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def fio_lines(fio: dict[str, PhaseResult]) -> list[str]:
    """The device-limit lines of a report: one per fio job (none when fio did not run)."""
    if not fio:
        return []
    lines = ["device limits (fio, io_uring, O_DIRECT, 1 job):"]
    for name, r in fio.items():
        x = {k: float(r.extra[k]) for k in ("iops", "MBps", "clat_p50_us", "clat_p99_us")}
        lines.append(f"  {name:<24} {x['iops']:>10,.0f} IOPS {x['MBps']:>8,.1f} MB/s"
                     f"  clat p50 {x['clat_p50_us']:,.0f} us p99 {x['clat_p99_us']:,.0f} us")
    return lines


def format_report(res: Results, cfg: StoreBenchConfig, header: list[str], skipped: dict[str, str]) -> str:
    """Renders the header lines, the per-phase table, fio limits and the targets."""
    lines = list(header)
    lines += fio_lines(res.get("fio", {}))
    for system, why in skipped.items():
        lines.append(f"SKIPPED {system}: {why}")
    lines.append("")
    if cfg.case != CASE:
        lines += _table_lines(res)
    case = res.get("ours", {}).get(CASE)
    if case is not None:
        lines.append(f"{CASE}: ours {case.rows_per_s:,.0f} rows/s over {case.rows:,} rows, "
                     f"{_fmt(case.cpu_us_per_row, '.2f')} CPU us/row, "
                     f"{int(case.extra['device_reads']):,} device reads, io_engine {case.extra['io_engine']}")
    lines.append("")
    lines.append("targets:")
    for t in evaluate_targets(res, cfg):
        lines.append(f"  [{t.status}] {t.name}: {t.detail}")
    errors = {f"{s}/{p}/{k}": r.extra[k] for s, ph in res.items() for p, r in ph.items()
              for k in ("errors", "reopen_errors") if r.extra.get(k)}
    lines.append(f"verification errors: {errors if errors else 'none'}")
    return "\n".join(lines)


def _table_lines(res: Results) -> list[str]:
    """The main run's per-phase table with its notes."""
    lines: list[str] = []
    head = (f"{'phase':<18}{'ours rows/s':>13}{'rocksdb':>11}{'memmap':>11}{'ours/rdb':>10}"
            f"{'ours/mmap':>10}{'ours hit':>9}{'rdb hit':>8}{'CPU us/row ours':>16}{'rdb':>7}{'mmap':>7}")
    lines += [head, "-" * len(head)]
    for label, po, pr, pm in TABLE_ROWS:
        o, r, m = (res.get(s, {}).get(p) for s, p in (("ours", po), ("rocksdb", pr), ("memmap", pm)))
        if o is None and r is None and m is None:
            continue
        ratio_r = o.rows_per_s / r.rows_per_s if o and r else None
        ratio_m = o.rows_per_s / m.rows_per_s if o and m else None
        hit_o = o.extra.get("hit_rate") if o else None
        hit_r = r.extra.get("block_cache_hit_rate") if r else None
        if r is not None and r.extra.get("row_cache_hits"):
            hit_r = float(r.extra["row_cache_hits"]) / max(1, r.rows)
        lines.append(
            f"{label:<18}{_fmt(o.rows_per_s if o else None):>13}{_fmt(r.rows_per_s if r else None):>11}"
            f"{_fmt(m.rows_per_s if m else None):>11}{_fmt(ratio_r, '.2f'):>10}{_fmt(ratio_m, '.2f'):>10}"
            f"{_fmt(hit_o, '.1%'):>9}{_fmt(hit_r, '.1%'):>8}"
            f"{_fmt(o.cpu_us_per_row if o else None, '.2f'):>16}{_fmt(r.cpu_us_per_row if r else None, '.2f'):>7}"
            f"{_fmt(m.cpu_us_per_row if m else None, '.2f'):>7}")
    zipf = res.get("ours", {}).get("read_cold_zipf")
    if zipf is not None:
        lines.append(f"ours zipf per-batch hit rate: {zipf.extra.get('per_batch_hit_rate')} "
                     f"(steady {_fmt(zipf.extra.get('steady_hit_rate'), '.1%')})")
    lines.append("read_warm_out: ours with read(out=) into a reused buffer (baselines: read_warm again). "
                 "warm_vs_rowcache: RocksDB warm reads with a row cache of the DRAM cache size "
                 "(hit = row-cache hits). rdb hit: block-cache data-block hit rate.")
    return lines


def write_results_json(path: Path, res: Results, config: dict[str, Any], meta: dict[str, Any],
                       skipped: dict[str, str], targets: list[Target]) -> None:
    """Writes every figure, the settings, the targets and what was skipped to ``path``
    (the JSON layout shared by every benchmark)."""
    doc = {
        "config": config,
        "meta": meta,
        "skipped": skipped,
        "results": {s: {p: r.to_dict() for p, r in ph.items()} for s, ph in res.items()},
        "targets": [t.__dict__ for t in targets],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


def write_json(path: Path, res: Results, cfg: StoreBenchConfig, meta: dict[str, Any],
               skipped: dict[str, str]) -> None:
    """Writes the store benchmark's figures, settings, targets and skipped baselines."""
    write_results_json(path, res, cfg.to_dict(), meta, skipped, evaluate_targets(res, cfg))
