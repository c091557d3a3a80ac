"""Targets, printed report and JSON output of the kernel benchmark."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Optional

from benchmarks.lib.report import Results, Target, fio_lines, write_results_json
from benchmarks.lib.types import KernelBenchConfig, PhaseResult

__all__ = ["DeviceTime", "device_time", "evaluate_targets", "format_report", "write_json"]

PHASE_LABELS = {
    "scm": "SCM (mmap), Zipf {a}, {p}",
    "ssd": "SSD (block store), Zipf {a}, {p}",
    "ssd_high_locality": "SSD, high locality: Zipf {a}, {p}",
}
"""Run names of the results table ("scm_<policy>": the extra policy runs on SCM)."""

HIT_RATE_GAP = 0.03
"""Target: the best policy's hit rate within 3 percentage points of Belady's."""
STATIC_GAP = 0.02
"""Target: the default policy within 2 points of the best static cache on i.i.d. Zipf."""


def _get(res: Results, system: str, phase: str) -> Optional[PhaseResult]:
    return res.get(system, {}).get(phase)


def _x(r: Optional[PhaseResult], key: str) -> Optional[float]:
    if r is None or key not in r.extra or r.extra[key] is None:
        return None
    return float(r.extra[key])


def _fmt(x: Optional[float], spec: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _label(phase: str, r: PhaseResult) -> str:
    a, p = r.extra.get("zipf_alpha"), r.extra.get("cache_algorithm")
    if phase in PHASE_LABELS:
        return PHASE_LABELS[phase].format(a=a, p=p)
    return f"SCM, Zipf {a}, {p} (hit rate run)"


def _fio_iops(res: Results, prefix: str) -> Optional[float]:
    """Mean IOPS of the fio jobs whose name starts with ``prefix`` (runs before/after)."""
    runs = [float(r.extra["iops"]) for k, r in res.get("fio", {}).items() if k.startswith(prefix)]
    return sum(runs) / len(runs) if runs else None


class DeviceTime:
    """The time the device needs for one SSD step at the rates fio measured.

    Attributes:
        read_s: rows loaded per step x one 4 KiB random read each, at fio's randread IOPS
            (queue depth = the store's).
        write_s: rows written back per step x row bytes at fio's sequential-write MB/s
            (the store appends to a log).
        write_random_s: the same rows as 4 KiB random writes at fio's randwrite IOPS
            (reference only).
        read_iops, write_MBps, randwrite_iops: the fio rates used.
    """

    def __init__(self, read_s: float, write_s: float, write_random_s: Optional[float], read_iops: float,
                 write_MBps: float, randwrite_iops: Optional[float]) -> None:
        self.read_s = read_s
        self.write_s = write_s
        self.write_random_s = write_random_s
        self.read_iops = read_iops
        self.write_MBps = write_MBps
        self.randwrite_iops = randwrite_iops

    @property
    def total_s(self) -> float:
        """read_s + write_s: one device serves both."""
        return self.read_s + self.write_s


def device_time(res: Results, cfg: KernelBenchConfig, phase: str) -> Optional[DeviceTime]:
    """Device seconds per step of an SSD run, or None without fio's figures."""
    r = _get(res, "ours", phase)
    iops = _fio_iops(res, "randread_4k")  # the kernel benchmark runs them at the store's QD
    seq = _get(res, "fio", "write_1m_seq")
    if r is None or iops is None or seq is None:
        return None
    rw = _fio_iops(res, "randwrite_4k")
    loaded, written = _x(r, "rows_loaded_per_step") or 0.0, _x(r, "rows_written_back_per_step") or 0.0
    mbps = float(seq.extra["MBps"])
    return DeviceTime(loaded / iops, written * cfg.row_bytes / (mbps * 1e6),
                      written / rw if rw else None, iops, mbps, rw)


def _ratio_target(name: str, res: Results, phase: str, goal: float) -> Target:
    o, b = _get(res, "ours", phase), _get(res, "fbgemm", phase)
    if o is None or b is None:
        return Target(name, "SKIP", "not measured")
    ours, base = float(o.extra["steps_per_s"]), float(b.extra["steps_per_s"])
    ratio = ours / base
    blocks = _block_ratios(o, b)
    detail = (f"{ours:.2f} vs {base:.2f} steps/s (medians of {o.extra['steps']} steps each) = {ratio:.2f}x "
              f"(goal {goal:g}x); block pairs {min(blocks):.2f}..{max(blocks):.2f}x, "
              f"median {statistics.median(blocks):.2f}x")
    return Target(name, "PASS" if ratio >= goal else "MISS", detail, ratio, goal)


def _block_ratios(o: PhaseResult, b: PhaseResult) -> list[float]:
    ov = [float(x) for x in str(o.extra["block_median_steps_per_s"]).split(",")]
    bv = [float(x) for x in str(b.extra["block_median_steps_per_s"]).split(",")]
    return [x / y for x, y in zip(ov, bv)]


def _ssd_target(res: Results, cfg: KernelBenchConfig) -> Target:
    name = "SSD tier, Zipf 1.05 workload: step time <= 1.2x max(all-DRAM compute, device time)"
    o, b = _get(res, "ours", "ssd"), _get(res, "fbgemm", "ssd")
    dev = device_time(res, cfg, "ssd")
    if o is None or b is None:
        return Target(name, "SKIP", "not measured")
    if dev is None:
        return Target(name, "SKIP", "fio did not run")
    step = float(o.extra["median_step_ms"]) / 1e3
    compute = float(b.extra["median_step_ms"]) / 1e3
    bound = max(compute, dev.total_s)
    ratio = step / bound
    detail = (f"step {1e3 * step:.0f} ms (median) vs max(DRAM compute {1e3 * compute:.0f} ms, device "
              f"{1e3 * dev.total_s:.0f} ms) = {ratio:.2f}x (goal <= 1.2x)")
    return Target(name, "PASS" if ratio <= 1.2 else "MISS", detail, ratio, 1.2)


def _hit_target(res: Results) -> Target:
    name = "hit rate: the best policy within 3 points of Belady (same cache rows, same trace)"
    opt = _get(res, "belady", "zipf")
    rates = {p: float(r.extra["hit_rate"]) for p, r in _policy_runs(res).items()}
    if opt is None or not rates:
        return Target(name, "SKIP", "not measured")
    best = max(rates, key=rates.get)
    optimal = float(opt.extra["hit_rate"])
    gap = optimal - rates[best]
    detail = (", ".join(f"{p.upper()} {v:.1%}" for p, v in rates.items())
              + f"; Belady {optimal:.1%} at {int(opt.extra['capacity']):,} rows; gap {100 * gap:.1f} points"
              + f" (best static cache {float(opt.extra['static_top_hit_rate']):.1%})")
    return Target(name, "PASS" if gap <= HIT_RATE_GAP else "MISS", detail, rates[best], optimal - HIT_RATE_GAP)


def _policy_runs(res: Results) -> dict[str, PhaseResult]:
    """Policy -> the run on the main (Zipf alpha) trace that measured its hit rate."""
    out: dict[str, PhaseResult] = {}
    for phase in ("scm", "ssd"):
        r = _get(res, "ours", phase)
        if r is not None:
            out.setdefault(str(r.extra["cache_algorithm"]), r)
    for phase, r in res.get("ours", {}).items():
        if phase.startswith("scm_"):
            out.setdefault(str(r.extra["cache_algorithm"]), r)
    return out


def evaluate_targets(res: Results, cfg: KernelBenchConfig) -> list[Target]:
    """Checks the kernel benchmark's targets against this run's figures."""
    return [
        _ratio_target("SCM tier, cache 10%: >= 0.85x FBGEMM all-DRAM throughput", res, "scm", 0.85),
        _ssd_target(res, cfg),
        _ratio_target("SSD tier, high-locality table (Zipf 1.3): >= 0.8x FBGEMM all-DRAM throughput",
                      res, "ssd_high_locality", 0.8),
        _hit_target(res),
        *_policy_targets(res),
    ]


def _replays(res: Results, trace: str) -> dict[str, float]:
    """Policy -> hit rate replayed on ``trace`` ("zipf" or "drift")."""
    return {str(r.extra["cache_algorithm"]): float(r.extra["hit_rate"])
            for r in res.get("policy_replay", {}).values() if r.extra["trace"] == trace}


def _policy_targets(res: Results) -> list[Target]:
    """The default policy against the best static cache (i.i.d. Zipf) and against LRU and
    LFU (drifting trace)."""
    from torchrec_mtrains.kernels.config import DEFAULTS

    default = DEFAULTS.cache_algorithm
    zipf, drift = _replays(res, "zipf"), _replays(res, "drift")
    ref = _get(res, "policy_reference", "zipf")
    name = f"policies: the default ({default}) within 2 points of the best static cache on i.i.d. Zipf"
    if ref is None or default not in zipf:
        out = [Target(name, "SKIP", "not measured")]
    else:
        static = float(ref.extra["static_hit_rate"])
        gap = static - zipf[default]
        out = [Target(name, "PASS" if gap <= STATIC_GAP else "MISS",
                      f"{default} {zipf[default]:.1%} vs best static {static:.1%}: gap {100 * gap:.1f} points "
                      f"(Belady {float(ref.extra['hit_rate']):.1%})", zipf[default], static - STATIC_GAP)]
    name = f"policies: the default ({default}) beats both LRU and LFU on the drifting trace"
    ref = _get(res, "policy_reference", "drift")
    if ref is None or not {default, "lru", "lfu"} <= set(drift):
        return out + [Target(name, "SKIP", "not measured")]
    rivals = max(drift[p] for p in ("lru", "lfu") if p != default)
    wins = default not in ("lru", "lfu") and drift[default] > max(drift["lru"], drift["lfu"])
    detail = (", ".join(f"{p} {v:.1%}" for p, v in drift.items())
              + f"; Belady {float(ref.extra['hit_rate']):.1%}, best static {float(ref.extra['static_hit_rate']):.1%}")
    return out + [Target(name, "PASS" if wins else "MISS", detail, drift[default], rivals)]


def _policy_lines(res: Results) -> list[str]:
    """The policy comparison's table: one line per trace."""
    lines = []
    for ref in res.get("policy_reference", {}).values():
        e = ref.extra
        rates = _replays(res, str(e["trace"]))
        lines.append(f"  {e['label']}: " + ", ".join(f"{p} {v:.1%}" for p, v in rates.items())
                     + f" | best static {float(e['static_hit_rate']):.1%}, Belady {float(e['hit_rate']):.1%}"
                     f" ({int(e['capacity']):,} rows, steps {e['counted_from_step']}..{int(e['steps']) - 1}, "
                     f"{ref.rows:,} accesses)")
    if not lines:
        return []
    return ["policy comparison (the cache index replayed alone, 32 ways, the previous step locked):"] + lines + [
        "  best static cache: i.i.d. Zipf: the most probable rows; drifting: the rows most used over the "
        "counted steps (hindsight, not demand-filled: it can exceed Belady there)."]


def _table(res: Results) -> list[str]:
    head = (f"{'run':<36}{'ours st/s':>10}{'fbgemm':>8}{'ratio':>7}{'blocks':>12}{'hit':>7}"
            f"{'uniq/st':>9}{'load/st':>9}{'wb/st':>9}{'tier ms':>8}{'wait ms':>8}{'CPU ms o/f':>12}")
    lines = [head, "-" * len(head)]
    for phase, o in res.get("ours", {}).items():
        b = _get(res, "fbgemm", phase)
        ratio = float(o.extra["steps_per_s"]) / float(b.extra["steps_per_s"]) if b else None
        blocks = _block_ratios(o, b) if b else []
        cpu = f"{_fmt(_x(o, 'cpu_ms_per_step'))}/{_fmt(_x(b, 'cpu_ms_per_step'))}"
        lines.append(
            f"{_label(phase, o):<36}{_fmt(_x(o, 'steps_per_s'), '.2f'):>10}{_fmt(_x(b, 'steps_per_s'), '.2f'):>8}"
            f"{_fmt(ratio, '.2f'):>7}{(f'{min(blocks):.2f}..{max(blocks):.2f}' if blocks else '-'):>12}"
            f"{_fmt(_x(o, 'hit_rate'), '.1%'):>7}{_fmt(_x(o, 'unique_rows_per_step')):>9}"
            f"{_fmt(_x(o, 'rows_loaded_per_step')):>9}{_fmt(_x(o, 'rows_written_back_per_step')):>9}"
            f"{_fmt(_x(o, 'tier_ms_per_step'), '.1f'):>8}{_fmt(_x(o, 'prefetch_wait_ms_per_step'), '.1f'):>8}"
            f"{cpu:>12}")
    lines.append("st/s: steps/s from the median step time; ratio: ours/fbgemm; blocks: range of the "
                 "per-block-pair ratios (block medians); hit: hits / distinct rows per step over the "
                 "measured steps; load/wb: rows read from / written back to the tier per step; tier ms: "
                 "prefetch-thread time in tier I/O; wait ms: forward's wait for the prefetch; CPU: "
                 "process CPU per step (all threads).")
    return lines


def _timing_lines(res: Results) -> list[str]:
    lines = ["step times (ms: median / p25..p75 / p90; steps/s per block):"]
    for system in ("ours", "fbgemm"):
        for phase, r in res.get(system, {}).items():
            ms = {k: _fmt(_x(r, f"{k}_step_ms"), ".1f") for k in ("median", "p25", "p75", "p90")}
            lines.append(f"  {system:<6} {phase:<18} {ms['median']:>7} / {ms['p25']}..{ms['p75']} / "
                         f"{ms['p90']}   blocks {r.extra.get('block_steps_per_s', '-')}")
    return lines


def _ssd_lines(res: Results, cfg: KernelBenchConfig) -> list[str]:
    lines = []
    for phase in ("ssd", "ssd_high_locality"):
        o, b = _get(res, "ours", phase), _get(res, "fbgemm", phase)
        dev = device_time(res, cfg, phase)
        if o is None:
            continue
        parts = [f"{phase}: step {_fmt(_x(o, 'median_step_ms'), '.0f')} ms "
                 f"(mean {_fmt(_x(o, 'mean_step_ms'), '.0f')})"]
        if dev is not None:
            rnd = f"{1e3 * dev.write_random_s:.0f} ms" if dev.write_random_s is not None else "-"
            parts.append(
                f"device {1e3 * dev.total_s:.0f} ms = reads {_fmt(_x(o, 'rows_loaded_per_step'))} x 4 KiB / "
                f"{dev.read_iops:,.0f} IOPS {1e3 * dev.read_s:.0f} ms + write-backs "
                f"{_fmt(_x(o, 'rows_written_back_per_step'))} x {cfg.row_bytes} B / {dev.write_MBps:,.0f} MB/s "
                f"{1e3 * dev.write_s:.1f} ms (as 4 KiB random writes: {rnd})")
        if b is not None:
            parts.append(f"all-DRAM compute {_fmt(_x(b, 'median_step_ms'), '.0f')} ms")
        parts.append(f"process I/O {(_x(o, 'proc_read_bytes_per_step') or 0) / 2**20:.1f} MiB read + "
                     f"{(_x(o, 'proc_write_bytes_per_step') or 0) / 2**20:.1f} MiB written per step "
                     f"(/proc/self/io)")
        lines.append("  " + "; ".join(parts))
    return ["SSD steps vs the device:"] + lines if lines else []


def _hit_lines(res: Results) -> list[str]:
    lines = []
    for key in ("zipf", "high_locality"):
        opt = _get(res, "belady", key)
        if opt is None:
            continue
        e = opt.extra
        if key == "zipf":
            runs = _policy_runs(res)
        else:
            r = _get(res, "ours", "ssd_high_locality")
            runs = {str(r.extra["cache_algorithm"]): r} if r is not None else {}
        pol = ", ".join(f"{p.upper()} {float(r.extra['hit_rate']):.1%}" for p, r in runs.items())
        grew = {float(r.extra["cache_capacity_rows"]) for r in runs.values()} - {float(e["capacity_nominal"])}
        lines.append(
            f"  Zipf {e['zipf_alpha']}, steps {e['counted_from_step']}..{int(e['steps']) - 1} "
            f"({opt.rows:,} accesses): kernel {pol}"
            + (f" (cache grew to {', '.join(f'{c:,.0f}' for c in sorted(grew))} rows)" if grew else "")
            + f" | fully assoc. LRU {float(e['lru_full_assoc_hit_rate']):.1%}, best static cache "
            f"{float(e['static_top_hit_rate']):.1%}, Belady {float(e['hit_rate']):.1%} "
            f"at {int(e['capacity']):,} rows"
            + (f" ({float(e['hit_rate_nominal']):.1%} at the nominal {int(e['capacity_nominal']):,})"
               if "hit_rate_nominal" in e else ""))
    if not lines:
        return []
    return ["hit rates over the measured steps (accesses: each step's distinct rows; a hit: the row "
            "was cached before the step):"] + lines + [
            "  fully assoc. LRU: exact LRU of the same size (the kernel's cache is 32-way set-associative); "
            "best static cache: always the most probable rows -- with independent Zipf draws no online "
            "policy beats it in expectation; Belady: offline optimum (knows the future), demand-filled."]


def _steady_lines(res: Results) -> list[str]:
    out = []
    for phase, o in res.get("ours", {}).items():
        loads, ev = _x(o, "rows_loaded_per_step") or 0.0, _x(o, "evictions_per_step") or 0.0
        out.append(f"{phase} {ev:,.0f}/{loads:,.0f}" + ("" if loads == 0 or ev >= 0.95 * loads else " (NOT full)"))
    return ["cache full during the measurement (evictions / loads per step): " + "; ".join(out)] if out else []


def format_report(res: Results, cfg: KernelBenchConfig, header: list[str], skipped: dict[str, str],
                  noise: list[str]) -> str:
    """Renders the header, fio limits, the results table, SSD/device and hit-rate figures
    and the targets."""
    lines = list(header)
    lines += fio_lines(res.get("fio", {}))
    for system, why in skipped.items():
        lines.append(f"SKIPPED {system}: {why}")
    lines.append("")
    if res.get("ours"):
        lines += _table(res) + [""] + _timing_lines(res) + [""]
    lines += _steady_lines(res)
    lines += _ssd_lines(res, cfg)
    lines += _hit_lines(res)
    lines += _policy_lines(res)
    lines += [""] + noise
    lines.append("")
    lines.append("targets:")
    for t in evaluate_targets(res, cfg):
        lines.append(f"  [{t.status}] {t.name}: {t.detail}")
    return "\n".join(lines)


def write_json(path: Path, res: Results, cfg: KernelBenchConfig, meta: dict[str, Any],
               skipped: dict[str, str]) -> None:
    """Writes the kernel benchmark's figures, settings, targets and skipped runs."""
    write_results_json(path, res, cfg.to_dict(), meta, skipped, evaluate_targets(res, cfg))


def noise_lines(res: Results, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> list[str]:
    """How noisy the run was: block-pair ratio spread and the machine's load average."""
    out = [f"noise: load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_before)} before, "
           f"{'/'.join(f'{x:.2f}' for x in load_after)} after the run"]
    for phase, o in res.get("ours", {}).items():
        b = _get(res, "fbgemm", phase)
        if b is None:
            continue
        r = _block_ratios(o, b)
        med = statistics.median(r)
        out.append(f"  {phase}: ours/fbgemm per block pair {', '.join(f'{x:.2f}' for x in r)} "
                   f"(spread {100 * (max(r) - min(r)) / med:.0f}% of the median)")
    return out
