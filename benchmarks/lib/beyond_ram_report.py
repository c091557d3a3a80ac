"""The beyond-RAM benchmark's figures (a dict for beyond_ram.json) and their text summary."""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional

from benchmarks.lib.beyond_ram_roofline import roofline_line
from benchmarks.lib.process_monitor import Sample

__all__ = ["MATERIALISED_GOAL", "PERF_MODEL_GOAL", "RSS_LIMIT_SHARE", "device_rates", "device_seconds_per_step", "figures",
           "per_tier_hits", "ssd_totals", "steady_step_seconds", "summary"]

RSS_LIMIT_SHARE = 0.5  # of RAM, for the whole run
MATERIALISED_GOAL = 1.5  # x RAM
PERF_MODEL_GOAL = 0.20  # |predicted step / measured - 1|


def steady_step_seconds(metrics: Dict) -> float:
    """Median seconds per step over the last half of the run's steps."""
    times = metrics["step_times"]
    half = times[len(times) // 2:]
    return statistics.median(b - a for a, b in zip(half, half[1:]))


def device_seconds_per_step(metrics: Dict, limits: Dict[str, float]) -> float:
    """The device time of a step's SSD I/O at fio's limits: its random row reads at the
    QD32 IOPS, its bytes written at the sequential write bandwidth."""
    ssd, steps = ssd_totals(metrics), len(metrics["step_times"])
    return (ssd["store_disk_rows_read"] / steps / limits["randread_iops"]
            + ssd["store_device_bytes_written"] / steps / limits["write_bytes_per_s"])


def ssd_totals(metrics: Dict) -> Dict[str, float]:
    """The SSD shards' store counters summed, and their rows and bytes materialised."""
    keys = ("store_disk_rows_read", "store_device_reads", "store_device_writes", "store_device_bytes_read",
            "store_device_bytes_written", "store_live_rows", "materialised_bytes")
    shards = [s for s in metrics["tiers"]["shards"].values() if s["tier"] == "SSD"]
    out = {k: sum(s.get(k, 0.0) for s in shards) for k in keys}
    maps = [s["store_dram_bytes_per_row"] for s in shards if "store_dram_bytes_per_row" in s]
    out["map_dram_bytes_per_logical_row"] = max(maps) if maps else float("nan")
    return out


def device_rates(samples: List[Sample]) -> Dict[str, float]:
    """Median and peak of the device's reads/s, writes/s and MB/s between samples."""
    rates: Dict[str, List[float]] = {"reads_per_s": [], "writes_per_s": [], "read_mb_per_s": [], "write_mb_per_s": []}
    for a, b in zip(samples, samples[1:]):
        dt = b.t - a.t
        if dt <= 0:
            continue
        rates["reads_per_s"].append((b.disk.reads - a.disk.reads) / dt)
        rates["writes_per_s"].append((b.disk.writes - a.disk.writes) / dt)
        rates["read_mb_per_s"].append((b.disk.read_bytes - a.disk.read_bytes) / dt / 1e6)
        rates["write_mb_per_s"].append((b.disk.write_bytes - a.disk.write_bytes) / dt / 1e6)
    out = {}
    for k, v in rates.items():
        out[f"{k}_median"] = statistics.median(v) if v else float("nan")
        out[f"{k}_max"] = max(v) if v else float("nan")
    return out


def per_tier_hits(metrics: Dict) -> Dict[str, Dict[str, float]]:
    """Per tier: the planner's predicted hit rate (tables weighted by lookups per step, as
    the warm measurement is) and the measured warm one."""
    placement, predicted = metrics["placement"], metrics["predicted_hit_rate"]
    shards = metrics["tiers"]["shards"]
    out: Dict[str, Dict[str, float]] = {}
    for tier in sorted(set(placement[t] for t in predicted)):
        tables = [t for t in predicted if placement[t] == tier]
        weights = {t: sum(s.get("cache_unique_rows", 0.0) for n, s in shards.items() if n.split(".r")[0] == t)
                   for t in tables}
        total = sum(weights.values()) or 1.0
        out[tier] = {"predicted": sum(predicted[t] * weights[t] for t in tables) / total,
                     "measured_warm": metrics["hit_rate_warm_per_tier"].get(tier, float("nan"))}
    return out


def figures(tiered: Dict, samples: List[Sample], peaks: Dict[str, int], ram: int, limits: Dict[str, float],
            baseline: Optional[Dict]) -> Dict[str, object]:
    steps = len(tiered["step_times"])
    global_batch = tiered["batch_size_per_rank"] * tiered["world_size"]
    step_s = steady_step_seconds(tiered)
    ssd = ssd_totals(tiered)
    span = tiered["step_times"][-1] if steps > 1 else float("nan")
    materialised = sum(tiered["tiers"]["materialised_bytes"].values())
    out: Dict[str, object] = {
        "ram_bytes": ram, "steps": steps, "global_batch": global_batch,
        "materialised_bytes": tiered["tiers"]["materialised_bytes"],
        "materialised_x_ram": materialised / ram,
        "logical_bytes": sum(r * s for r, s in _logical(tiered)),
        "peak_rss_bytes": peaks["rss"], "peak_rss_anon_bytes": peaks["rss_anon"],
        "peak_rss_one_process_bytes": peaks["rss_max_process"], "peak_disk_bytes": peaks["disk_bytes"],
        "rss_x_ram": peaks["rss"] / ram,
        "qps_steady": global_batch / step_s, "step_seconds_steady": step_s,
        "train_seconds": span, "wall_seconds": tiered["wall_seconds"],
        "hit_rate_per_tier": per_tier_hits(tiered),
        "hit_rate_per_table": {t: {"predicted": tiered["predicted_hit_rate"][t],
                                   "measured_warm": tiered["hit_rate_warm"].get(t, float("nan"))}
                               for t in tiered["predicted_hit_rate"]},
        "ssd": {**ssd,
                "rows_read_per_s": ssd["store_disk_rows_read"] / span,
                "reads_per_s": ssd["store_device_reads"] / span,
                "reads_per_step": ssd["store_device_reads"] / max(1, steps),
                "writes_per_s": ssd["store_device_writes"] / span,
                "read_mb_per_s": ssd["store_device_bytes_read"] / span / 1e6,
                "write_mb_per_s": ssd["store_device_bytes_written"] / span / 1e6},
        "device": device_rates(samples), "fio": limits,
        "lookahead": tiered.get("lookahead"),
        "predicted_step_seconds": tiered["predicted_step_seconds"],
        "perf_model_error": tiered["predicted_step_seconds"] / step_s - 1.0,
        "dram_bytes_per_ssd_row": peaks["rss"] / max(1.0, ssd["store_live_rows"]),
    }
    if "memory_cgroup" in tiered:  # run with --memory-limit: ``ram`` is the limit
        out["memory_cgroup"] = tiered["memory_cgroup"]
    out["checkpoints"] = tiered.get("checkpoints", [])
    if "resume_check" in tiered:
        out["resume_check"] = tiered["resume_check"]
    if limits:
        out["device_seconds_per_step"] = device_seconds_per_step(tiered, limits)
    if baseline is not None:
        base_step = steady_step_seconds(baseline)
        out["baseline"] = {"qps_steady": global_batch / base_step, "step_seconds_steady": base_step,
                           "table_rows": baseline["table_rows"], "auc": baseline["auc"]}
        out["qps_ratio"] = out["qps_steady"] / out["baseline"]["qps_steady"]
        device = out.get("device_seconds_per_step", 0.0)
        out["roofline_step_seconds"] = max(base_step, device)
        out["step_x_roofline"] = step_s / out["roofline_step_seconds"]
    return out


def _logical(metrics: Dict):
    row_bytes = {n.split(".r")[0]: s["row_bytes"] for n, s in metrics["tiers"]["shards"].items()}
    dim_bytes = (metrics["embedding_dim"] + 1) * 4
    for table, rows in metrics["table_rows"].items():
        yield rows, row_bytes.get(table, dim_bytes)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def summary(f: Dict) -> str:
    gb = 1e9
    lines = [
        f"beyond-RAM run: {f['steps']} steps of {f['global_batch']:,} samples; RAM {f['ram_bytes'] / gb:.1f} GB; "
        f"tables' logical size {f['logical_bytes'] / gb:,.0f} GB",
        "materialised rows: " + ", ".join(f"{t} {b / gb:.1f} GB" for t, b in f["materialised_bytes"].items())
        + f" = {f['materialised_x_ram']:.2f}x RAM [{_verdict(f['materialised_x_ram'] >= MATERIALISED_GOAL)}] "
          f"goal >= {MATERIALISED_GOAL}x",
        f"peak RSS, all processes: {f['peak_rss_bytes'] / gb:.1f} GB = {f['rss_x_ram']:.2f}x RAM "
        f"[{_verdict(f['rss_x_ram'] <= RSS_LIMIT_SHARE)}] goal <= {RSS_LIMIT_SHARE}x (anonymous "
        f"{f['peak_rss_anon_bytes'] / gb:.1f} GB; largest process {f['peak_rss_one_process_bytes'] / gb:.1f} GB); "
        f"peak disk {f['peak_disk_bytes'] / gb:.1f} GB",
        f"QPS in steady state: {f['qps_steady']:,.0f} ({f['step_seconds_steady'] * 1e3:.0f} ms/step); "
        f"trained in {f['train_seconds'] / 60:.1f} min, wall {f['wall_seconds'] / 60:.1f} min",
        "hit rate per tier (predicted / measured, warm caches): "
        + ", ".join(f"{t} {h['predicted']:.3f} / {h['measured_warm']:.3f}" for t, h in f["hit_rate_per_tier"].items()),
    ]
    if "memory_cgroup" in f:
        m = f["memory_cgroup"]
        lines.append(f"memory cgroup (--memory-limit; RAM above is the limit): limit {m['limit_bytes'] / gb:.2f} GB, "
                     f"peak {m['peak_bytes'] / gb:.2f} GB (rss {m['rss_bytes'] / gb:.2f} GB, page cache "
                     f"{m['cache_bytes'] / gb:.2f} GB at the end), limit hit {m['limit_hits']:,} times, "
                     f"{m['oom_kills']} processes killed for memory")
    s, d, fio = f["ssd"], f["device"], f["fio"]
    lines.append(
        f"SSD (stores' counters over the run): {s['rows_read_per_s']:,.0f} rows read/s, {s['reads_per_s']:,.0f} "
        f"reads/s, {s['read_mb_per_s']:.1f} MB/s read; {s['writes_per_s']:,.0f} writes/s, "
        f"{s['write_mb_per_s']:.1f} MB/s written; {s.get('reads_per_step', float('nan')):,.0f} reads per step "
        f"(look-ahead window {f.get('lookahead', '?')} batches)")
    lines.append(
        f"device (diskstats, median / max of 2 s windows): reads/s {d['reads_per_s_median']:,.0f} / "
        f"{d['reads_per_s_max']:,.0f}, read MB/s {d['read_mb_per_s_median']:.0f} / {d['read_mb_per_s_max']:.0f}, "
        f"write MB/s {d['write_mb_per_s_median']:.0f} / {d['write_mb_per_s_max']:.0f}")
    if fio:
        lines.append(f"fio limits (this run): 4 KiB random reads QD32 {fio['randread_iops']:,.0f} IOPS; "
                     f"1 MiB sequential writes {fio['write_bytes_per_s'] / 1e6:,.0f} MB/s; the run used "
                     f"{s['reads_per_s'] / fio['randread_iops']:.1%} of the read IOPS and "
                     f"{s['write_mb_per_s'] * 1e6 / fio['write_bytes_per_s']:.1%} of the write bandwidth on average")
    lines.append(f"perf model: predicted step {f['predicted_step_seconds'] * 1e3:.0f} ms vs measured "
                 f"{f['step_seconds_steady'] * 1e3:.0f} ms ({f['perf_model_error']:+.0%}) "
                 f"[{_verdict(abs(f['perf_model_error']) <= PERF_MODEL_GOAL)}] goal within {PERF_MODEL_GOAL:.0%}")
    lines.append(f"DRAM per SSD-resident row: {f['dram_bytes_per_ssd_row']:,.0f} B (peak RSS / SSD live rows); "
                 f"the location map alone: {f['ssd']['map_dram_bytes_per_logical_row']:.2f} B per logical row")
    if "baseline" in f:
        b = f["baseline"]
        lines.append(f"baseline (ids hashed into at most {max(b['table_rows'].values()):,} rows per table, all "
                     f"in DRAM, FBGEMM alone): {b['qps_steady']:,.0f} QPS ({b['step_seconds_steady'] * 1e3:.0f} "
                     f"ms/step)")
        lines.append(f"QPS ratio tiered / baseline: {f['qps_ratio']:.2f}x [{_verdict(f['qps_ratio'] >= 0.5)}] "
                     "goal >= 0.5x (aim 0.8x)")
        lines.append(f"roofline max(compute {b['step_seconds_steady'] * 1e3:.0f} ms, device "
                     f"{f.get('device_seconds_per_step', float('nan')) * 1e3:.0f} ms) = "
                     f"{f['roofline_step_seconds'] * 1e3:.0f} ms; step / roofline {f['step_x_roofline']:.2f}x "
                     f"[{_verdict(f['step_x_roofline'] <= 1.25)}] goal <= 1.25x")
    if "cpu_roofline" in f:
        lines.append(roofline_line(f["cpu_roofline"]))
    lines += _checkpoint_lines(f)
    return "\n".join(lines)


def _checkpoint_lines(f: Dict) -> List[str]:
    gb = 1e9
    lines = []
    for c in f.get("checkpoints", []):
        lines.append(f"checkpoint at step {c['step']} ({c['kind']}): {c['seconds']:.0f} s; "
                     f"{c.get('rows_linked', 0) / 1e6:.1f}M SSD rows ({c.get('linked_row_bytes', 0) / gb:.1f} GB) "
                     f"linked by {c.get('map_bytes', 0) / gb:.2f} GB of location maps; "
                     f"{c['rows_written'] / 1e6:.1f}M rows ({c['row_bytes'] / gb:.2f} GB) copied; "
                     f"step files {c['bytes'] / gb:.2f} GB")
    r = f.get("resume_check")
    if r:
        ok = r["losses_identical"] and r["auc_identical"]
        lines.append(f"resume from step {r['from_step']}'s checkpoint: losses of {r['steps_compared']} steps and "
                     f"the final AUC ({r['auc']:.4f}) bit-identical to the uninterrupted run: "
                     f"{'yes' if ok else 'NO'} [{_verdict(ok)}]; wall {r['wall_seconds'] / 60:.1f} min "
                     f"({r['train_seconds'] / 60:.1f} training), peak disk {r['peak_disk_bytes'] / gb:.1f} GB")
    return lines
