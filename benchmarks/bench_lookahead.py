#!/usr/bin/env python3
"""Hit rates of the row cache with a look-ahead window of k batches, against Belady's
optimum, exact LRU and (for i.i.d. Zipf) the best static cache, on the same traces.

Each trace is replayed through the cache index as the kernel plans it (benchmarks/lib/
lookahead.py) for every policy and window; the report gives each hit rate, its gain over
the same policy without a window (measured in the same run) and the overflow slots the
window's locked rows took past the cache. Target (the kernel benchmark's Zipf 1.05 case,
4M rows, 10% cache): a window reaching the best static cache's hit rate.

Usage::

    python benchmarks/bench_lookahead.py [--windows 0,1,2,4,8,16,32] [--policies lru,lfu,tinylfu]
        [--traces zipf,realistic] [--realistic-tables t0_2m,t2_500k,t3_200k] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from benchmarks.lib.belady import belady_hits, lru_hits, static_hits  # noqa: E402
from benchmarks.lib.lookahead import LookaheadTrace, realistic_trace, replay_window  # noqa: E402

WAYS = 32  # the kernel's default


def _zipf_trace(quick: bool) -> LookaheadTrace:
    from benchmarks.lib import kernel_steps as ks
    from benchmarks.lib.types import KernelBenchConfig

    cfg = KernelBenchConfig()
    if quick:
        cfg = dataclasses.replace(cfg, rows=cfg.rows // 8, batch=cfg.batch // 8)
    batches = ks.make_batches(cfg, cfg.zipf_alpha, cfg.seed, cfg.warmup_steps)
    capacity = max(1, int(round(cfg.rows * cfg.cache_load_factor)))
    name = (f"Zipf {cfg.zipf_alpha} ({cfg.rows:,} rows, batch {cfg.batch:,} x pooling {cfg.pooling}, "
            f"kernel benchmark's main workload)")
    return LookaheadTrace(name, batches.step_ids(), batches.warmup, capacity, batches.order[:capacity])


def _run_trace(trace: LookaheadTrace, windows: List[int], policies: List[str], log) -> Dict:
    t0 = time.perf_counter()
    refs = {
        "belady": belady_hits(trace.steps, trace.capacity, trace.warmup).hit_rate,
        "exact_lru": lru_hits(trace.steps, trace.capacity, trace.warmup).hit_rate,
    }
    if trace.static_rows is not None:
        refs["best_static"] = static_hits(trace.steps, trace.static_rows, trace.warmup).hit_rate
    log(f"  references in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(f"{k} {v:.1%}" for k, v in refs.items()))
    rows: List[Dict] = []
    for policy in policies:
        base = None
        for k in windows:
            t0 = time.perf_counter()
            r = replay_window(trace.steps, trace.capacity, WAYS, policy, trace.warmup, k)
            base = r.hit_rate if k == 0 else base
            rows.append({"policy": policy, "lookahead": k, "hit_rate": r.hit_rate,
                         "gain_points": None if base is None else 100 * (r.hit_rate - base),
                         "overflow_slots": r.capacity - trace.capacity, "seconds": time.perf_counter() - t0})
            log(f"  {policy:8s} k={k:<3d} hit {r.hit_rate:.2%}"
                + ("" if base is None else f" ({100 * (r.hit_rate - base):+.2f} points)")
                + f", overflow {r.capacity - trace.capacity:,} slots")
    uniq = [len(set(s.tolist())) for s in trace.steps[trace.warmup:trace.warmup + 20]]
    return {"name": trace.name, "capacity": trace.capacity, "steps": len(trace.steps), "warmup": trace.warmup,
            "unique_per_step": sum(uniq) / max(1, len(uniq)), "references": refs, "runs": rows}


def _report(results: List[Dict]) -> List[str]:
    lines = []
    for t in results:
        refs = t["references"]
        lines.append(f"{t['name']}: cache {t['capacity']:,} rows, {t['unique_per_step']:,.0f} distinct rows/step, "
                     f"steps {t['warmup']}..{t['steps'] - 1} counted")
        lines.append("  references: " + ", ".join(f"{k} {v:.1%}" for k, v in refs.items()))
        policies = sorted({r["policy"] for r in t["runs"]}, key=[r["policy"] for r in t["runs"]].index)
        windows = sorted({r["lookahead"] for r in t["runs"]})
        lines.append("  policy    " + "".join(f"{'k=' + str(k):>16s}" for k in windows))
        for p in policies:
            cells = []
            for k in windows:
                r = next(x for x in t["runs"] if x["policy"] == p and x["lookahead"] == k)
                gain = "" if not k or r["gain_points"] is None else f" {r['gain_points']:+.1f}"
                cells.append(f"{r['hit_rate']:.1%}{gain}".rjust(16))
            lines.append(f"  {p:8s}  " + "".join(cells))
        lines.append("  (a run whose overflow pool grew is a larger cache than Belady's and the others')")
        lines.append("  overflow slots (DRAM past the cache for the window's locked rows): "
                     + "; ".join(f"{p} " + ", ".join(
                         f"k={r['lookahead']}: {r['overflow_slots']:,}" for r in t["runs"] if r["policy"] == p)
                         for p in policies))
        best = max(t["runs"], key=lambda r: r["hit_rate"])
        if "best_static" in refs:
            no_window = max(r["hit_rate"] for r in t["runs"] if r["lookahead"] == 0)
            reached = [r for r in t["runs"] if r["hit_rate"] >= refs["best_static"]]
            first = min(reached, key=lambda r: r["lookahead"]) if reached else None
            verdict = ("MET" if first else "MISS")
            lines.append(f"  [{verdict}] hit rate with look-ahead >= best static cache ({refs['best_static']:.1%}): "
                         f"best {best['hit_rate']:.1%} ({best['policy']}, k={best['lookahead']}), without a window "
                         f"{no_window:.1%}"
                         + (f"; first reached at k={first['lookahead']} ({first['policy']}, "
                            f"{first['overflow_slots']:,} overflow slots = "
                            f"{first['overflow_slots'] / t['capacity']:.1%} of the cache)" if first else "")
                         + f"; Belady {refs['belady']:.1%}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", default="0,1,2,4,8,16,32")
    p.add_argument("--policies", default="lru,lfu,tinylfu")
    p.add_argument("--traces", default="zipf,realistic")
    p.add_argument("--realistic-tables", default="t0_2m,t2_500k,t3_200k")
    p.add_argument("--realistic-steps", type=int, default=400)
    p.add_argument("--realistic-cache-share", type=float, default=0.2,
                   help="realistic tables' cache, as a share of the rows each draws from")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="an eighth of the Zipf table and batch, fewer steps")
    args = p.parse_args(argv)
    windows = sorted({int(x) for x in args.windows.split(",")} | {0})
    policies = [x for x in args.policies.split(",") if x]
    traces: List[LookaheadTrace] = []
    kinds = set(args.traces.split(","))
    if "zipf" in kinds:
        traces.append(_zipf_trace(args.quick))
    if "realistic" in kinds:
        steps = args.realistic_steps // (4 if args.quick else 1)
        for table in args.realistic_tables.split(","):
            traces.append(realistic_trace(table, steps, steps // 4, args.realistic_cache_share))
    results = []
    for trace in traces:
        print(f"{trace.name}: {len(trace.steps)} steps, cache {trace.capacity:,} ...", flush=True)
        results.append(_run_trace(trace, windows, policies, lambda s: print(s, flush=True)))
    print()
    for line in _report(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
