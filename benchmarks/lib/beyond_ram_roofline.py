"""What the beyond-RAM run could reach on this machine: a CPU roofline and its ceiling.

On a CPU node the tier reads' CPU and the compute share the cores, so the step cannot beat

    CPU roofline = compute step + (the slowest rank's SSD reads per step) x (fio's CPU per
                   4 KiB read) / (cores per rank)

where the compute step is the hashed all-DRAM baseline's (the same model with no tier I/O,
measured in the same run) and fio's CPU per read is its user + system CPU over the reads of
its random-read job (measured in the same run). The ceiling is that roofline with the reads
Belady's optimal cache would need at the run's cache sizes over the run's own trace (the
example's synthetic batches, regenerated here from its seed): no policy, window or
prefetch can read less. Step / CPU roofline says how far the run is from what its own reads
allow; QPS ratio / ceiling how far from what any cache of its size allows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from benchmarks.lib.belady import belady_hits

__all__ = ["SsdTrace", "belady_reads_by_rank", "cpu_roofline", "example_on_path", "fio_cpu_seconds_per_read", "ssd_trace"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dlrm"


def example_on_path() -> None:
    """Puts the example DLRM's modules (its parser, data and counters) on sys.path, once."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))


def fio_cpu_seconds_per_read(usr_cpu_pct: float, sys_cpu_pct: float, seconds: float, ios: int) -> float:
    """CPU seconds fio spent per I/O of a one-thread job."""
    return (usr_cpu_pct + sys_cpu_pct) / 100.0 * seconds / max(1, ios)


def reads_per_step_by_rank(metrics: Dict) -> List[float]:
    """Each rank's SSD device reads per step over the run."""
    steps = max(1, len(metrics["step_times"]))
    return [r.get("tier_device_reads", 0.0) / steps for r in metrics["tiers"].get("ranks", [])]


def cpu_roofline(compute_step_s: float, reads_by_rank: Sequence[float], cpu_s_per_read: float,
                 cores_per_rank: float) -> float:
    """The step the compute and the slowest rank's reads' CPU allow (seconds)."""
    return compute_step_s + (max(reads_by_rank) if reads_by_rank else 0.0) * cpu_s_per_read / cores_per_rank


class SsdTrace:
    """The run's SSD tables' ids, step by step (every rank's batch of the step together)."""

    def __init__(self, tables: Dict[str, List[np.ndarray]]) -> None:
        self.tables = tables

    def shard_steps(self, table: str, lo: int, hi: int) -> List[np.ndarray]:
        """The steps' ids of ``table`` in rows [lo, hi)."""
        return [ids[(ids >= lo) & (ids < hi)] for ids in self.tables[table]]


def ssd_trace(train_argv: Sequence[str], tables: Sequence[str], steps: int, world_size: int) -> SsdTrace:
    """The ids the example's synthetic data gives ``tables`` over ``steps`` steps of
    ``world_size`` ranks, for the run ``train.py train_argv`` made (its preset, scale, seed,
    drift and batch; the data is a pure function of them)."""
    example_on_path()
    import train  # the example's own parser: the run's settings exactly
    from data import SyntheticData, scaled_tables

    args = train.parse_args(list(train_argv))
    data = SyntheticData(scaled_tables(args.table_scale, args.tables), args.batch_size, args.seed, args.drift,
                         args.max_rows)
    keys = {f"f_{t}": t for t in tables}
    out: Dict[str, List[np.ndarray]] = {t: [] for t in tables}
    for step in range(steps):
        parts: Dict[str, List[np.ndarray]] = {t: [] for t in tables}
        for rank in range(world_size):
            features = data.batch(step, rank).sparse_features.to_dict()
            for key, table in keys.items():
                parts[table].append(features[key].values().numpy())
        for table in tables:
            out[table].append(np.concatenate(parts[table]).astype(np.int64))
    return SsdTrace(out)


def _shard_ranges(metrics: Dict) -> Dict[str, tuple]:
    """SSD shard -> (table, first row, end row, rank, cache rows, device reads per row read)."""
    shards = {n: s for n, s in metrics["tiers"]["shards"].items() if s["tier"] == "SSD"}
    rows = metrics["table_rows"]
    out = {}
    for name, s in shards.items():
        table, rest = name.split(".r", 1)
        lo = int(rest.split(".c")[0])
        offsets = sorted({int(n.split(".r", 1)[1].split(".c")[0]) for n in shards if n.split(".r", 1)[0] == table})
        hi = next((o for o in offsets if o > lo), rows[table])
        per_row = s.get("store_device_reads", 0.0) / s["store_disk_rows_read"] if s.get("store_disk_rows_read") else 1.0
        out[name] = (table, lo, hi, s.get("rank"), int(s["cache_cache_capacity_rows"]), per_row)
    return out


def belady_reads_by_rank(metrics: Dict, trace: SsdTrace) -> Optional[List[float]]:
    """Each rank's SSD reads per step if every SSD shard's cache were Belady's at its size:
    its misses but each row's first (a row never written is made, not read), times the run's
    device reads per row read from disk on that shard; None when the run did not record its
    shards' ranks."""
    ranges = _shard_ranges(metrics)
    if any(r[3] is None for r in ranges.values()):
        return None
    steps = len(next(iter(trace.tables.values()))) if trace.tables else 0
    reads = [0.0] * metrics["world_size"]
    for table, lo, hi, rank, capacity, per_row in ranges.values():
        shard_steps = trace.shard_steps(table, lo, hi)
        opt = belady_hits(shard_steps, max(1, capacity), 0)
        # A row's first miss reads nothing: it was never written, so it is made, not read.
        first = np.unique(np.concatenate(shard_steps)).size if shard_steps else 0
        reads[rank] += max(0, opt.accesses - opt.hits - first) * per_row / max(1, steps)
    return reads


def roofline_figures(metrics: Dict, step: float, compute_step_s: float, cpu_s_per_read: float,
                     cores_per_rank: float, belady_reads: Optional[Sequence[float]]) -> Dict[str, object]:
    """The CPU roofline of a run whose steady step is ``step`` seconds and, given Belady's
    reads per rank, its ceiling (see the module docstring): the figures the report prints
    beside the QPS ratio."""
    reads = reads_per_step_by_rank(metrics)
    roof = cpu_roofline(compute_step_s, reads, cpu_s_per_read, cores_per_rank)
    out: Dict[str, object] = {
        "compute_step_seconds": compute_step_s, "cpu_seconds_per_read": cpu_s_per_read,
        "cores_per_rank": cores_per_rank, "reads_per_step_by_rank": reads,
        "reads_max_over_mean": max(reads) / (sum(reads) / len(reads)) if reads and sum(reads) > 0 else float("nan"),
        "cpu_roofline_step_seconds": roof, "step_over_cpu_roofline": step / roof,
    }
    if belady_reads is not None:
        ceiling = cpu_roofline(compute_step_s, belady_reads, cpu_s_per_read, cores_per_rank)
        out.update({"belady_reads_per_step_by_rank": list(belady_reads), "ceiling_step_seconds": ceiling,
                    "ceiling_qps_ratio": compute_step_s / ceiling,
                    "qps_ratio_over_ceiling": (compute_step_s / step) / (compute_step_s / ceiling)})
    return out


def roofline_line(r: Dict) -> str:
    """One summary line of ``roofline_figures``."""
    reads = ", ".join(f"{x:,.0f}" for x in r["reads_per_step_by_rank"])
    line = (f"CPU roofline: compute {r['compute_step_seconds'] * 1e3:.0f} ms + slowest rank's reads ({reads} per step "
            f"by rank, max / mean {r['reads_max_over_mean']:.2f}) x fio's {r['cpu_seconds_per_read'] * 1e6:.1f} us CPU "
            f"per read / {r['cores_per_rank']:g} cores = {r['cpu_roofline_step_seconds'] * 1e3:.0f} ms; "
            f"step / CPU roofline {r['step_over_cpu_roofline']:.2f}")
    if "ceiling_step_seconds" in r:
        belady = ", ".join(f"{x:,.0f}" for x in r["belady_reads_per_step_by_rank"])
        line += (f"; with Belady's reads ({belady} per step by rank) the ceiling is "
                 f"{r['ceiling_step_seconds'] * 1e3:.0f} ms = {r['ceiling_qps_ratio']:.2f}x the baseline's QPS, "
                 f"QPS ratio / ceiling {r['qps_ratio_over_ceiling']:.2f}")
    return line
