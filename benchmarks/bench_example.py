#!/usr/bin/env python3
"""The MTrainS claim in miniature: the example DLRM with the DRAM budget at a third
of its embedding bytes -- the planner puts the rest on SCM and SSD -- against the same model
with every table in DRAM, side by side in one run (runs alternate; medians of QPS).

    .venv/bin/python benchmarks/bench_example.py [--rounds 2] [--steps 200] [--nproc 2]

``--compare CHECKOUT`` instead trains the tiered example (DRAM budget 1/3) with this checkout
and with another one (its extension built in place: ``setup.py build_ext --inplace``),
alternating, and prints this checkout's QPS over the other's (target >= 1.15x when the other
is the previous main).
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


def run(nproc: int, steps: int, budget: int, out: str, root: str = ROOT) -> dict:
    """One run of the example from checkout ``root`` (its own package first on the path)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(root, "examples", "dlrm", "train.py"), "--steps", str(steps),
           "--dram-budget", str(budget), "--scm-budget", "none", "--out", out]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1800, env=env)
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
    p.add_argument("--compare", default=None, help="another checkout to compare the tiered example's QPS with")
    args = p.parse_args(argv)
    total = embedding_bytes(args.embedding_dim)
    if args.compare:
        return compare(args, total // 3 // args.nproc, os.path.abspath(args.compare))
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


def compare(args: argparse.Namespace, budget: int, other: str) -> int:
    """The tiered example with this checkout and with ``other``, alternating (which goes first
    alternates too); prints the median QPS of each and their ratio."""
    roots = {"this checkout": ROOT, os.path.basename(other.rstrip("/")) or other: other}
    qps = {k: [] for k in roots}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            order = list(roots.items()) if r % 2 == 0 else list(reversed(roots.items()))
            for name, root in order:
                m = run(args.nproc, args.steps, budget, os.path.join(d, f"{r}-{len(qps[name])}"), root)
                qps[name].append(m["qps"])
    print(f"example DLRM (tiered, DRAM budget 1/3), {args.nproc} ranks, {args.steps} steps; "
          f"{args.rounds} alternating rounds")
    for name, values in qps.items():
        print(f"  {name:<20} QPS median {statistics.median(values):>9,.0f}  (runs: "
              f"{', '.join(f'{v:,.0f}' for v in values)})")
    ratio = statistics.median(qps["this checkout"]) / statistics.median(next(v for k, v in qps.items()
                                                                               if k != "this checkout"))
    print(f"  this / other QPS {ratio:.2f}x  [{'PASS' if ratio >= 1.15 else 'MISS'}] target >= 1.15x the previous main")
    return 0


if __name__ == "__main__":
    sys.exit(main())
