"""The memory sweep of bench_beyond_ram.py (``--sweep``): the tiered job again at several
memory limits, each ``rows written / limit`` apart, against the one baseline of the run.

A point's limit is the rows the first tiered run wrote to the tiers (its materialised
bytes) divided by the point's ratio: at ratio 4 the job holds a quarter of the rows it
trains in memory, RSS and page cache together. Each point reports its QPS against the
hashed-down all-DRAM baseline measured in the same run, the roofline (the baseline's step
or the device time of its misses at fio's limits) and the planner's predicted step, the
memory group's peak and page cache against the limit, and each rank's tier reads. A point
the kernel stopped for memory is reported as such, not as a failed benchmark: the curve a
user reads before buying memory ends there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.lib.beyond_ram_report import device_seconds_per_step, steady_step_seconds
from benchmarks.lib.beyond_ram_roofline import example_on_path, roofline_line

__all__ = ["parse_ratios", "plot_sweep", "sweep_lines", "sweep_point"]

SWEEP_GOAL = (4.0, 0.75)  # at rows written / limit = 4, QPS >= 0.75x the all-DRAM baseline


def parse_ratios(text: Optional[str]) -> List[float]:
    """``--sweep`` ("0.5,1,2,4,8") as positive ratios; ValueError naming the flag."""
    if not text:
        return []
    try:
        ratios = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sweep {text!r} must be comma-separated numbers (rows written / memory limit)") from None
    if not ratios or any(not 0 < r < float("inf") for r in ratios):
        raise ValueError(f"--sweep {text!r}: every ratio must be a finite number > 0")
    return ratios


def sweep_point(ratio: float, limit: int, metrics: Optional[Dict], error: str, limits: Dict[str, float],
                baseline: Optional[Dict]) -> Dict[str, object]:
    """One point's figures: ``metrics`` of its run (None when it did not finish: ``error``
    says why); ``limits``: fio's; ``baseline``: the run's baseline metrics (or None)."""
    point: Dict[str, object] = {"ratio": ratio, "limit_bytes": limit, "finished": metrics is not None}
    if metrics is None:
        point["error"] = error
        return point
    step = steady_step_seconds(metrics)
    global_batch = metrics["batch_size_per_rank"] * metrics["world_size"]
    ranks = metrics["tiers"].get("ranks", [])
    example_on_path()
    from tier_report import max_over_mean, rows_read_per_rank  # how the example counts them

    reads = rows_read_per_rank(ranks)
    point.update({
        "qps_steady": global_batch / step, "step_seconds_steady": step,
        "predicted_step_seconds": metrics["predicted_step_seconds"],
        "memory_cgroup": metrics.get("memory_cgroup", {}),
        "rank_tier_rows_read": reads,
        "reads_max_over_mean": max_over_mean(reads),
    })
    if baseline is not None:
        base_step = steady_step_seconds(baseline)
        point["qps_ratio"] = base_step / step
        point["roofline_step_seconds"] = max(base_step, device_seconds_per_step(metrics, limits) if limits else 0.0)
    return point


def sweep_lines(points: Sequence[Dict]) -> List[str]:
    """The summary's lines of the sweep."""
    gb = 1e9
    lines = ["memory sweep (rows written / memory limit; the tiered run in a memory cgroup of that limit):"]
    for p in points:
        head = f"  {p['ratio']:g}x (limit {p['limit_bytes'] / gb:.2f} GB): "
        if not p["finished"]:
            lines.append(head + f"did not finish: {str(p['error']).splitlines()[0][:300]}")
            continue
        m = p["memory_cgroup"]
        ratio = p.get("qps_ratio")
        goal = ""
        if ratio is not None and p["ratio"] == SWEEP_GOAL[0]:
            goal = f" [{'PASS' if ratio >= SWEEP_GOAL[1] else 'MISS'}] goal >= {SWEEP_GOAL[1]}x"
        lines.append(
            head + f"QPS {p['qps_steady']:,.0f}"
            + (f" = {ratio:.2f}x the baseline{goal}" if ratio is not None else "")
            + f"; step {p['step_seconds_steady'] * 1e3:.0f} ms (predicted {p['predicted_step_seconds'] * 1e3:.0f} ms"
            + (f", roofline {p['roofline_step_seconds'] * 1e3:.0f} ms" if "roofline_step_seconds" in p else "")
            + f"); peak {m.get('peak_bytes', 0) / gb:.2f} GB, page cache {m.get('cache_bytes', 0) / gb:.2f} GB at "
              f"the end; tier reads per rank {', '.join(f'{r:,.0f}' for r in p['rank_tier_rows_read'])}"
            + (f" (max / mean {p['reads_max_over_mean']:.2f})" if p["rank_tier_rows_read"] else ""))
        if "cpu_roofline" in p:
            lines.append("    " + roofline_line(p["cpu_roofline"]))
    return lines


def plot_sweep(points: Sequence[Dict], path: Path) -> None:
    """QPS ratio against rows written / memory limit (points that did not finish marked at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [p for p in points if p["finished"] and "qps_ratio" in p]
    stopped = [p for p in points if not p["finished"]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([p["ratio"] for p in done], [p["qps_ratio"] for p in done], "o-", label="tiered / all-DRAM baseline")
    ceiling = [p for p in done if "ceiling_qps_ratio" in p.get("cpu_roofline", {})]
    if ceiling:
        ax.plot([p["ratio"] for p in ceiling], [p["cpu_roofline"]["ceiling_qps_ratio"] for p in ceiling], "s--",
                label="ceiling: CPU roofline with Belady's reads")
    if stopped:
        ax.plot([p["ratio"] for p in stopped], [0.0] * len(stopped), "rx", label="did not finish (memory)")
    ax.axhline(1.0, color="k", ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows written / memory limit")
    ax.set_ylabel("QPS ratio")
    ax.set_title("beyond-RAM training: speed against memory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
