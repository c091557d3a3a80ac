#!/usr/bin/env python3
"""The MTrainS claim in miniature: the example DLRM with the DRAM budget at a third
of its embedding bytes -- the planner puts the rest on SCM and SSD -- against the same model
with every table in DRAM, side by side in one run (runs alternate; medians of QPS).

    .venv/bin/python benchmarks/bench_example.py [--rounds 2] [--steps 200] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "dlrm"))


def embedding_bytes(dim: int) -> int:
    from data import DEFAULT_TABLES

    from torchrec_mtrains.layout import TableLayout

    row_bytes = TableLayout(dim, "fp32", "exact_row_wise_adagrad").row_bytes  # the example's tables
    return sum(t.num_rows * row_bytes for t in DEFAULT_TABLES)


def run(nproc: int, steps: int, budget: int, out: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "examples", "dlrm", "train.py"), "--steps", str(steps),
           "--dram-budget", str(budget), "--scm-budget", "none", "--out", out]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--embedding-dim", type=int, default=32)
    args = p.parse_args(argv)
    total = embedding_bytes(args.embedding_dim)
    budgets = {"tiered (DRAM budget 1/3)": total // 3 // args.nproc, "all in DRAM": 2 * total}
    qps = {k: [] for k in budgets}
    last = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name, budget in budgets.items():
                m = run(args.nproc, args.steps, budget, os.path.join(d, f"{r}-{len(qps[name])}-{name[:3]}"))
                qps[name].append(m["qps"])
                last[name] = m
    print(f"example DLRM, {args.nproc} ranks, {args.steps} steps, embeddings {total / 2**20:,.0f} MiB; "
          f"{args.rounds} alternating rounds")
    for name, values in qps.items():
        m = last[name]
        tiers = {}
        for t, tier in m["placement"].items():
            tiers[tier] = tiers.get(tier, 0) + 1
        print(f"  {name:<26} QPS median {statistics.median(values):>9,.0f}  (runs: "
              f"{', '.join(f'{v:,.0f}' for v in values)}; predicted {m['predicted_qps']:,.0f})  "
              f"tables per tier {tiers}  AUC {m['auc']:.3f}  "
              f"hit rates {', '.join(f'{k} {v:.3f}' for k, v in m['hit_rate_per_tier'].items()) or '-'}")
    a, b = (statistics.median(qps[k]) for k in budgets)
    ratio = a / b
    print(f"  ratio {ratio:.2f}x  [{'PASS' if ratio >= 0.8 else 'MISS'}] goal >= 0.8x all-DRAM QPS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
