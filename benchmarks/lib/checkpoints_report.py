"""The checkpoint benchmark's figures, targets and printed summary, from its raw results
(``checkpoints.py``: the disk's bandwidth and each run's saves as ``metrics.json`` lists them).

Per save: ``bytes`` (the step's files, all ranks), ``rows_written`` and ``row_bytes`` (tiered
rows saved, weights + optimizer state, ids not counted), ``dense_bytes`` (the dense-state
files: everything not tiered, FUSED tables included), ``seconds`` (flush of the tiers until
``latest`` switched). Targets:

- a delta's bytes <= 1.2 x its rows' bytes + the dense state: ``(bytes - dense) / row_bytes``;
- a delta's save time <= 2 x its bytes / the sequential write bandwidth;
- a full save's time <= 1.5 x its tiered rows' bytes / min(sequential read, write bandwidth);
- write bandwidth and capacity reduced against saving a full checkpoint every time, next to
  Check-N-Run's 6-17x and 2.5-8x (NSDI'22; its figures include quantizing the rows, which
  differential saves alone do not do), and >= 4x for the bytes written;
- a delta on disk <= 0.3 x a full step on disk (medians of the measured run);
- the save throughput (bytes / seconds of a save that stops training) >= 0.5 x the
  sequential write bandwidth;
- the async run's training stall per save (``blocking_seconds`` / the run's median step)
  <= 2 steps;
- the restore's seconds and the AUC after resuming from quantized deltas vs exact ones
  (reported).
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.lib.report import Target

__all__ = ["GOALS", "evaluate", "keep_chains_replay", "run_figures", "save_figures", "save_table", "summary", "targets"]

GOALS = {
    "delta_bytes_x_rows": 1.2,  # (bytes - dense) / row_bytes
    "delta_seconds_x_disk": 2.0,  # seconds / (bytes / write bandwidth)
    "full_seconds_x_disk": 1.5,  # seconds / (row_bytes / min(read, write bandwidth))
    "write_reduction": 6.0,  # Check-N-Run: 6-17x
    "capacity_reduction": 2.5,  # Check-N-Run: 2.5-8x
    "bytes_reduction": 4.0,  # bytes written vs a full at every save
    "delta_over_full": 0.3,  # median delta bytes / median full bytes
    "throughput_x_write": 0.5,  # (bytes / seconds) / sequential write bandwidth
    "stall_steps": 2.0,  # async: blocking seconds / median step seconds
}
CHECK_N_RUN = {"write_reduction": "6-17x", "capacity_reduction": "2.5-8x"}
MB = 1e6


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def save_figures(save: Dict, disk: Dict) -> Dict:
    """One save's record with its ratios against the targets' budgets."""
    write_bw = disk["write_bytes_per_s"]
    min_bw = min(write_bw, disk["read_bytes_per_s"])
    tiered_file_bytes = save["bytes"] - save["dense_bytes"]
    return {
        **save,
        "tiered_file_bytes": tiered_file_bytes,
        "bytes_x_rows": _div(tiered_file_bytes, save["row_bytes"]),
        "bytes_x_budget": _div(save["bytes"], 1.2 * save["row_bytes"] + save["dense_bytes"]),
        "seconds_x_write": _div(save["seconds"], save["bytes"] / write_bw),
        "seconds_x_rows_min_bw": _div(save["seconds"], save["row_bytes"] / min_bw),
        "write_seconds": save["bytes"] / write_bw,
    }


def keep_chains_replay(saves: Sequence[Dict], keep: int) -> Tuple[int, List[int]]:
    """(peak bytes, steps kept at the end) of a checkpoint directory under the keep-chains
    rule (``chain.remove_leftovers``), from the saves' bytes: after each save every step of
    the older chains is still there until that save switched ``latest``; then chains
    beyond the ``keep`` newest go. The peak is the largest sum just before a cleanup."""
    alive: Dict[int, Tuple[int, int]] = {}  # step -> (its chain's full step, bytes)
    base, peak = None, 0
    for s in saves:
        base = s["step"] if s["kind"] == "full" or base is None else base
        alive[s["step"]] = (base, s["bytes"])
        peak = max(peak, sum(b for _, b in alive.values()))
        older = sorted({b for b, _ in alive.values() if b < base}, reverse=True)[: keep - 1]
        kept = {base, *older}
        alive = {k: v for k, v in alive.items() if v[0] in kept}
    return peak, sorted(alive)


def _accounting(run: Dict, config: Dict, kept: List[int]) -> Dict:
    """Whether every save is in the record, and the directory holds what the rule keeps."""
    every = config["checkpoint_every"]
    expected = [every * i for i in range(1, config["steps"] // every + 1)]
    recorded = [s["step"] for s in run["checkpoints"]]
    on_disk = {int(k): v for k, v in run["on_disk_at_end"].items()}
    sizes = {s["step"]: s["bytes"] for s in run["checkpoints"]}
    return {
        "expected_saves": len(expected), "recorded_saves": len(recorded),
        "missing_saves": sorted(set(expected) - set(recorded)),
        "unexpected_saves": sorted(set(recorded) - set(expected)),
        "kept_by_rule": kept, "on_disk_at_end": sorted(on_disk),
        "size_mismatches": {k: [sizes.get(k), v] for k, v in on_disk.items() if sizes.get(k) != v},
    }


def _forced_fulls(saves: Sequence[Dict], full_every: int) -> List[int]:
    """Full saves made before ``full_every`` saves of their chain: by the chain-size rule."""
    out, since = [], None
    for s in saves:
        if s["kind"] == "full":
            if since is not None and since < full_every:
                out.append(s["step"])
            since = 1
        else:
            since = (since or 0) + 1
    return out


def run_figures(run: Dict, disk: Dict, config: Dict) -> Dict:
    """Totals, disk use and time share of one run's saves."""
    saves = [save_figures(s, disk) for s in run["checkpoints"]]
    peak_rule, kept = keep_chains_replay(saves, run["keep_chains"])
    seconds = sum(s["seconds"] for s in saves)
    return {
        "saves": saves, "fulls": sum(s["kind"] == "full" for s in saves),
        "deltas": sum(s["kind"] == "delta" for s in saves),
        "total_bytes": sum(s["bytes"] for s in saves), "total_row_bytes": sum(s["row_bytes"] for s in saves),
        "total_dense_bytes": sum(s["dense_bytes"] for s in saves),
        "total_tiered_file_bytes": sum(s["tiered_file_bytes"] for s in saves),
        "checkpoint_seconds": seconds, "wall_seconds": run["wall_seconds"],
        "time_share": _div(seconds, run["wall_seconds"]),
        "peak_disk_bytes_by_rule": peak_rule, "peak_disk_bytes_sampled": run["peak_sampled_disk_bytes"],
        "fulls_by_chain_size_rule": _forced_fulls(saves, run["full_every"]),
        "accounting": _accounting(run, config, kept),
    }


def _median_step(run: Dict) -> float:
    times = run.get("step_times") or []
    steps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(steps) if steps else float("nan")


def _stalls(run: Dict, figures: Dict) -> List[Tuple[int, float]]:
    """(step, training stopped for the save in steps) of each save of a run."""
    step = _median_step(run)
    return [(s["step"], _div(s.get("blocking_seconds", s["seconds"]), step)) for s in figures["saves"]]


def evaluate(raw: Dict) -> Tuple[Dict, List[Target]]:
    """The figures of a results file's raw part, and the targets checked on them."""
    runs = {name: run_figures(r, raw["disk"], raw["config"]) for name, r in raw["runs"].items()}
    base, meas = runs["baseline"], runs["measured"]
    deltas = [s["bytes"] for s in meas["saves"] if s["kind"] == "delta"]
    fulls = [s["bytes"] for s in meas["saves"] if s["kind"] == "full"]
    write_bw = raw["disk"]["write_bytes_per_s"]
    f = {
        "delta_over_full": _div(statistics.median(deltas), statistics.median(fulls)) if deltas and fulls
        else float("nan"),
        "throughput_x_write": [(s["step"], _div(_div(s["bytes"], s["seconds"]), write_bw)) for s in meas["saves"]],
        "stall_steps": {name: _stalls(raw["runs"][name], runs[name]) for name in runs},
        "median_step_seconds": {name: _median_step(r) for name, r in raw["runs"].items()},
        "resumed": raw.get("resumed", {}),
        # Wall time each run lost per save against the training without saves, in its steps.
        "lost_steps_per_save": {
            name: _div(_div(r["wall_seconds"] - raw["no_saves"]["wall_seconds"], len(r["checkpoints"])),
                       _median_step(raw["no_saves"]))
            for name, r in raw["runs"].items()} if "no_saves" in raw else {},
        "runs": runs,
        "write_reduction": _div(base["total_bytes"], meas["total_bytes"]),
        "write_reduction_tiered": _div(base["total_tiered_file_bytes"], meas["total_tiered_file_bytes"]),
        # Every save kept restorable: one full per save, against the chain(s) of all saves.
        "capacity_reduction_every_save": _div(base["total_bytes"], meas["total_bytes"]),
        "capacity_reduction_peak_by_rule": _div(base["peak_disk_bytes_by_rule"], meas["peak_disk_bytes_by_rule"]),
        "capacity_reduction_peak_sampled": _div(base["peak_disk_bytes_sampled"], meas["peak_disk_bytes_sampled"]),
        "same_training": all(r["losses"] == raw["runs"]["baseline"]["losses"] for r in raw["runs"].values()),
    }
    return f, targets(f, raw["config"]["interval"])


def _worst(name: str, values: List[Tuple[int, float]], goal: float, what: str) -> Target:
    """A target met when every save's ratio is at most ``goal``; SKIP without saves."""
    finite = [(step, v) for step, v in values if not math.isnan(v)]
    if not finite:
        return Target(name, "SKIP", f"no {what} with a defined ratio")
    step, worst = max(finite, key=lambda x: x[1])
    med = statistics.median(v for _, v in finite)
    status = "PASS" if worst <= goal else "MISS"
    return Target(name, status, f"worst {worst:.2f}x (step {step}), median {med:.2f}x over {len(finite)} {what} "
                                f"(goal <= {goal:g}x)", worst, goal)


def _at_least(name: str, ratio: float, goal: float, detail: str) -> Target:
    if math.isnan(ratio):
        return Target(name, "SKIP", detail)
    return Target(name, "PASS" if ratio >= goal else "MISS", f"{ratio:.2f}x: {detail}", ratio, goal)


def targets(f: Dict, interval: float) -> List[Target]:
    """The targets checked on ``evaluate``'s figures (``interval``: seconds between disk samples)."""
    runs = f["runs"]
    deltas = [s for s in runs["measured"]["saves"] if s["kind"] == "delta"]
    fulls = [s for r in runs.values() for s in r["saves"] if s["kind"] == "full"]
    base, meas = runs["baseline"], runs["measured"]
    t = [
        _worst(f"delta on disk / full on disk <= {GOALS['delta_over_full']:g} (medians, measured run)",
               [(0, f["delta_over_full"])], GOALS["delta_over_full"], "runs"),
        _at_least(f"bytes written vs a full at every save >= {GOALS['bytes_reduction']:g}x", f["write_reduction"],
                  GOALS["bytes_reduction"], f"{base['total_bytes'] / MB:,.1f} vs {meas['total_bytes'] / MB:,.1f} MB"),
        _at_least(f"save throughput vs sequential write >= {GOALS['throughput_x_write']:g}x (slowest save, measured)",
                  min((v for _, v in f["throughput_x_write"]), default=float("nan")), GOALS["throughput_x_write"],
                  "bytes / seconds of each save that stops training, against the disk's sequential write"),
    ]
    if "async" in runs:
        t.append(_worst(f"training stall per save <= {GOALS['stall_steps']:g} steps (async run)",
                        f["stall_steps"]["async"], GOALS["stall_steps"], "saves"))
        t.append(Target("training stall per save of the stopped saves (measured run)", "INFO",
                        ", ".join(f"{step}: {v:.1f}" for step, v in f["stall_steps"]["measured"]) + " steps"))
    if f["lost_steps_per_save"]:
        t.append(Target("wall time lost per save vs the training without saves, in its median steps", "INFO",
                        ", ".join(f"{n} {v:.1f}" for n, v in f["lost_steps_per_save"].items())))
    for name, r in f["resumed"].items():
        t.append(Target(f"resume from the {name} chain", "INFO",
                        f"restore {r['restore_seconds']:.2f} s (step {r['resumed_from']}), AUC after "
                        f"the resumed run's end {r['auc']:.4f}"))
    t += [
        _worst("delta bytes <= 1.2 x rows' bytes: (bytes - dense_bytes) / row_bytes",
               [(s["step"], s["bytes_x_rows"]) for s in deltas], GOALS["delta_bytes_x_rows"], "deltas"),
        _worst("  delta bytes / (1.2 x row_bytes + dense_bytes)",
               [(s["step"], s["bytes_x_budget"]) for s in deltas], 1.0, "deltas"),
        _worst("delta save time <= 2 x bytes / seq write bw",
               [(s["step"], s["seconds_x_write"]) for s in deltas], GOALS["delta_seconds_x_disk"], "deltas"),
        _worst("full save time <= 1.5 x row_bytes / min(seq read, seq write bw)",
               [(s["step"], s["seconds_x_rows_min_bw"]) for s in fulls], GOALS["full_seconds_x_disk"],
               "full saves of both runs"),
        _at_least(f"write reduction >= {GOALS['write_reduction']:g}x (Check-N-Run {CHECK_N_RUN['write_reduction']})",
                  f["write_reduction"], GOALS["write_reduction"],
                  f"baseline wrote {base['total_bytes'] / MB:,.1f} MB in {len(base['saves'])} saves, measured "
                  f"{meas['total_bytes'] / MB:,.1f} MB"),
        _at_least(f"capacity reduction, every save restorable >= {GOALS['capacity_reduction']:g}x (Check-N-Run "
                  f"{CHECK_N_RUN['capacity_reduction']})", f["capacity_reduction_every_save"],
                  GOALS["capacity_reduction"], "a full per save vs all the saves' chains (= the write reduction)"),
        _at_least(f"capacity reduction, peak on disk with --keep-chains 1 >= {GOALS['capacity_reduction']:g}x",
                  f["capacity_reduction_peak_by_rule"], GOALS["capacity_reduction"],
                  f"baseline {base['peak_disk_bytes_by_rule'] / MB:,.1f} MB vs measured "
                  f"{meas['peak_disk_bytes_by_rule'] / MB:,.1f} MB (by the keep-chains rule from the saves' bytes; "
                  f"sampled every {interval:g} s: {base['peak_disk_bytes_sampled'] / MB:,.1f} vs "
                  f"{meas['peak_disk_bytes_sampled'] / MB:,.1f} MB = {f['capacity_reduction_peak_sampled']:.2f}x)"),
        Target("write reduction of the tiered rows alone (dense state excluded)", "INFO",
               f"{f['write_reduction_tiered']:.2f}x ({base['total_tiered_file_bytes'] / MB:,.1f} vs "
               f"{meas['total_tiered_file_bytes'] / MB:,.1f} MB)", f["write_reduction_tiered"]),
        Target("time share of checkpointing (sum of save seconds / wall seconds)", "INFO",
               f"baseline {base['time_share']:.1%} ({base['checkpoint_seconds']:.1f} / {base['wall_seconds']:.1f} s), "
               f"measured {meas['time_share']:.1%} ({meas['checkpoint_seconds']:.1f} / {meas['wall_seconds']:.1f} s)"),
        Target("full saves before --full-every by the chain-size rule (measured run)", "INFO",
               f"steps {meas['fulls_by_chain_size_rule'] or 'none'}; {meas['fulls']} full, {meas['deltas']} delta"),
    ]
    t.append(_account_target(f))
    return t


def _account_target(f: Dict) -> Target:
    problems = []
    for name, r in f["runs"].items():
        a = r["accounting"]
        if a["missing_saves"] or a["unexpected_saves"]:
            problems.append(f"{name}: saves missing {a['missing_saves']}, unexpected {a['unexpected_saves']}")
        if a["on_disk_at_end"] != a["kept_by_rule"]:
            problems.append(f"{name}: on disk {a['on_disk_at_end']} vs kept by the rule {a['kept_by_rule']}")
        if a["size_mismatches"]:
            problems.append(f"{name}: step bytes (record, on disk) differ: {a['size_mismatches']}")
    if not f["same_training"]:
        problems.append("the two runs' losses differ: not the same training")
    counts = ", ".join(f"{n} {r['accounting']['recorded_saves']}/{r['accounting']['expected_saves']}"
                       for n, r in f["runs"].items())
    return Target("every save accounted for, same training in both runs", "MISS" if problems else "PASS",
                  "; ".join(problems) or f"saves recorded {counts}; the directory holds what the rule keeps; "
                                         "losses identical")


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def save_table(runs: Dict) -> List[str]:
    head = (f"{'run':<9}{'step':>6} {'kind':<6}{'MB':>8}{'rows':>11}{'row MB':>8}{'dense MB':>9}{'s':>7}"
            f"{'(B-d)/rows':>11}{'B/budget':>9}{'s/(B/w)':>9}{'s/(rows/min)':>13}")
    lines = [head, "-" * len(head)]
    for name, r in runs.items():
        for s in r["saves"]:
            lines.append(
                f"{name:<9}{s['step']:>6} {s['kind']:<6}{s['bytes'] / MB:>8.1f}{s['rows_written']:>11,}"
                f"{s['row_bytes'] / MB:>8.1f}{s['dense_bytes'] / MB:>9.1f}{s['seconds']:>7.2f}"
                f"{_fmt(s['bytes_x_rows'], '.3f'):>11}{_fmt(s['bytes_x_budget'], '.3f'):>9}"
                f"{_fmt(s['seconds_x_write'], '.1f'):>9}{_fmt(s['seconds_x_rows_min_bw'], '.1f'):>13}")
    return lines


def summary(raw: Dict, f: Dict, targets_: List[Target]) -> str:
    c, d = raw["config"], raw["disk"]
    runs = f["runs"]
    placement = raw["runs"]["measured"]["placement"]
    lines = [
        f"differential checkpoints: {c['steps']} steps, a save every {c['checkpoint_every']}, baseline --full-every 1 "
        f"vs measured --full-every {c['full_every']}, --keep-chains 1; example args: {c['example_args'] or '(none)'}",
        "tables: " + ", ".join(f"{t} {tier}" for t, tier in sorted(placement.items()))
        + " (DRAM here is TorchRec's FUSED kernel unless tiered; FUSED tables are in the dense state)",
        f"checkpoint filesystem {raw['checkpoint_fs']}: sequential write {d['write_bytes_per_s'] / MB:,.0f} MB/s, "
        f"read {d['read_bytes_per_s'] / MB:,.0f} MB/s ({d['method']}; {d['file_bytes'] / 2**20:,.0f} MiB file)",
        "",
        *save_table(runs),
        "(B-d)/rows: (bytes - dense_bytes) / row_bytes; B/budget: bytes / (1.2 row_bytes + dense_bytes); "
        "s/(B/w): seconds / (bytes / write bw); s/(rows/min): seconds / (row_bytes / min(read, write bw))",
        "",
    ]
    for name, r in runs.items():
        lines.append(f"{name}: {r['fulls']} full + {r['deltas']} delta saves, {r['total_bytes'] / MB:,.1f} MB written "
                     f"({r['total_row_bytes'] / MB:,.1f} MB of rows, {r['total_dense_bytes'] / MB:,.1f} MB dense), "
                     f"{r['checkpoint_seconds']:.1f} s saving of {r['wall_seconds']:.1f} s wall; peak on disk "
                     f"{r['peak_disk_bytes_by_rule'] / MB:,.1f} MB by the rule, "
                     f"{r['peak_disk_bytes_sampled'] / MB:,.1f} "
                     f"MB sampled")
    lines += ["", "targets:"]
    lines += [f"  [{t.status}] {t.name}: {t.detail}" for t in targets_]
    return "\n".join(lines)
