#!/usr/bin/env python3
"""Useful rows per SSD read, and the reads a step, for each layout of written-back rows and
each way of taking a read block's other rows, against today's (eviction order, nothing
taken) on the same trace: benchmarks/lib/block_layout.py replays it.

Traces: the example DLRM's realistic-locality tables (Meta's dlrm_datasets reuse histogram
with drift; benchmarks/lib/lookahead.realistic_trace) and its Zipf tables, a cache of
``--cache-share`` of the rows each draws from, at the example's 132-B rows (dim 32: 31 rows
a 4 KiB block) and the beyond-RAM preset's 516-B rows (dim 128: 7 a block).

Usage::

    python benchmarks/bench_block_layout.py [--tables t0_2m,t2_500k,t1_1m] [--steps 1500]
        [--cache-share 0.2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from benchmarks.lib.block_layout import replay_layout  # noqa: E402
from benchmarks.lib.lookahead import realistic_trace  # noqa: E402

BLOCK = 4096
ROW_BYTES = {"dim 32": 132, "dim 128": 516}  # fp32 weights + the row-wise Adagrad state
CASES = [("eviction", ""), ("hotness", ""), ("eviction", "cold"), ("hotness", "cold"), ("eviction", "warm"),
         ("hotness", "warm"), ("eviction", "window"), ("hotness", "window")]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", default="t0_2m,t2_500k,t1_1m")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--cache-share", type=float, default=0.2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    results: List[Dict] = []
    for table in args.tables.split(","):
        trace = realistic_trace(table, args.steps, args.steps // 3, args.cache_share)
        for dim, row_bytes in ROW_BYTES.items():
            per_block = BLOCK // row_bytes
            print(f"{trace.name}, {dim} ({per_block} rows a block), cache {trace.capacity:,} rows, "
                  f"steps {trace.warmup}..{len(trace.steps) - 1} counted", flush=True)
            base = None
            for layout, coload in CASES:
                t0 = time.perf_counter()
                r = replay_layout(trace.steps, trace.capacity, per_block, layout, coload, trace.warmup)
                base = base or r
                row = {"table": trace.name, "row_bytes": row_bytes, "rows_per_block": per_block, "layout": layout,
                       "coload": coload or "none", "reads_per_step": r.reads_per_step,
                       "reads_ratio": r.reads_per_step / base.reads_per_step,
                       "useful_rows_per_read": r.useful_rows_per_read, "hit_rate": r.hit_rate,
                       "coloaded_per_step": r.coloaded / r.steps, "coloaded_hit_share":
                           r.coloaded_hit / r.coloaded if r.coloaded else 0.0}
                results.append(row)
                print(f"  layout {layout:8s} take {row['coload']:4s}: {r.reads_per_step:8,.1f} reads/step "
                      f"({row['reads_ratio']:.3f}x today's), {r.useful_rows_per_read:.3f} useful rows/read, "
                      f"hit {r.hit_rate:.2%}, taken {row['coloaded_per_step']:,.1f}/step of which "
                      f"{row['coloaded_hit_share']:.1%} hit ({time.perf_counter() - t0:.1f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
