#!/usr/bin/env python3
"""Virtual tables against hashed tables: speed of the kernel, and the example's AUC.

Two parts (``--parts``):

``kernel``: the training step of one table, alternated ``--repeat`` times in one run:

- ``virtual``: a virtual table (``VirtualTableSpec``) fed ``--live`` distinct raw ids
  drawn from [0, 2^62);
- ``dense``: the same model as a dense table of exactly ``--live`` rows, rank r on row
  perm(r) (a random permutation: hashed ids land on rows at random, so the hot rows are not
  packed together): what a ``key_value`` table holding the same live rows does, with no id
  to look up.

Both have the same tier (``--tier``), row cache (``--cache-fraction`` of the live rows) and
batches: ``--batch`` ids a step over ranks Zipf(``--alpha``)-distributed, through the
prefetch pipeline as a train pipeline drives it. Prints each case's steps per second in
the steady state (every id already made) and on the first pass (ids made as they come),
and the ratio virtual / dense of each; and the index's DRAM bytes per live id.

``example``: ``examples/dlrm/train.py`` for ``--example-steps`` steps, alternated
``--example-repeat`` times: with ``--virtual-tables`` (the large tables fed raw ids, each
id its own row); as it is (``dense``: the large tables dense, each row number its own row,
placed on the tiers by the planner); and once per ``--hashed-rows`` value with
``--max-rows`` (the ids hashed into that many rows, unrelated ids sharing a row). The
synthetic data plants a hidden effect per id, so rows shared by ids lose signal. Prints
AUC, QPS, the virtual tables' DRAM per live id, and the bytes the tiers hold. Usage::

    .venv/bin/python benchmarks/bench_virtual_tables.py [--parts kernel,example] [--tier ssd] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import torch  # noqa: E402

from torchrec_mtrains import Tier  # noqa: E402
from torchrec_mtrains.kernels import TieredEmbeddingBags  # noqa: E402
from torchrec_mtrains.kernels.virtual_rows import VirtualTableSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DIM = 64


def _zipf_ranks(g: torch.Generator, live: int, n: int, alpha: float) -> torch.Tensor:
    """``n`` ranks in [0, live), rank r drawn with probability ~ (r + 1)^-alpha."""
    u = torch.rand(n, generator=g, dtype=torch.float64)
    # Inverse of the continuous Zipf CDF on [1, live + 1).
    a = 1.0 - alpha
    r = ((u * ((live + 1) ** a - 1.0)) + 1.0) ** (1.0 / a) - 1.0
    return r.long().clamp_(0, live - 1)


def _kernel(kind: str, args, directory: str) -> TieredEmbeddingBags:
    virtual = [VirtualTableSpec(id_space=2**62)] if kind == "virtual" else None
    return TieredEmbeddingBags([(args.live, DIM)], tier=Tier(args.tier), cache_rows=int(args.cache_fraction * args.live),
                               storage_dir=directory, table_names=[kind], virtual_tables=virtual,
                               init_range=(-0.01, 0.01),
                               prefetch_pipeline={"auto": None, "on": True, "off": False}[args.stage_threads])


def _steps_per_second(emb: TieredEmbeddingBags, batches: List[torch.Tensor], bag: int) -> float:
    """Trains ``batches`` with a prefetch one batch ahead; steps per second."""
    offsets = torch.arange(0, batches[0].numel() + 1, bag)
    emb.prefetch(batches[0], offsets)
    t0 = time.perf_counter()
    for i, ids in enumerate(batches):
        out = emb(ids, offsets)
        if i + 1 < len(batches):
            emb.prefetch(batches[i + 1], offsets)
        out.sum().backward()
    return len(batches) / (time.perf_counter() - t0)


def run_kernel(args) -> Dict[str, object]:
    g = torch.Generator().manual_seed(1)
    # The live ids: rank r is raw id key[r] (distinct, from [0, 2^62)) or dense row r.
    key = torch.unique(torch.randint(0, 2**62, (int(args.live * 1.05),), generator=g))[: args.live]
    key = key[torch.randperm(key.numel(), generator=g)]
    if key.numel() < args.live:
        raise SystemExit("could not draw enough distinct ids")
    ranks = [_zipf_ranks(g, args.live, args.batch, args.alpha) for _ in range(args.steps)]
    # The first pass draws every rank once (rows made as they come), in batches.
    first = torch.randperm(args.live, generator=g).split(args.batch)
    first = [f for f in first if f.numel() == args.batch]
    perm = torch.randperm(args.live, generator=g)
    ids = {"virtual": lambda r: key[r], "dense": lambda r: perm[r]}
    out: Dict[str, Dict[str, List[float]]] = {k: {"first_pass": [], "steady": []} for k in ids}
    index_bytes: List[float] = []
    for rep in range(args.repeat):
        for kind in (("virtual", "dense") if rep % 2 == 0 else ("dense", "virtual")):
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                emb = _kernel(kind, args, d)
                to_ids = ids[kind]
                out[kind]["first_pass"].append(_steps_per_second(emb, [to_ids(r) for r in first], args.bag))
                out[kind]["steady"].append(_steps_per_second(emb, [to_ids(r) for r in ranks], args.bag))
                if kind == "virtual":
                    index_bytes.append(emb.cache_stats()["virtual"]["index_bytes_per_live_id"])
                emb.close()
            print(f"  repeat {rep} {kind}: first pass {out[kind]['first_pass'][-1]:.1f} steps/s, "
                  f"steady {out[kind]['steady'][-1]:.1f} steps/s", flush=True)
    result: Dict[str, object] = {"settings": {k: getattr(args, k) for k in
                                              ("live", "batch", "bag", "steps", "alpha", "tier", "cache_fraction")}}
    for phase in ("first_pass", "steady"):
        v, d = statistics.median(out["virtual"][phase]), statistics.median(out["dense"][phase])
        result[phase] = {"virtual_steps_s": v, "dense_steps_s": d, "ratio": v / d,
                         "ratios": [a / b for a, b in zip(out["virtual"][phase], out["dense"][phase])]}
    result["index_bytes_per_live_id"] = statistics.median(index_bytes)
    return result


def _example(args, extra: List[str], out_dir: str) -> Dict[str, object]:
    cmd = [sys.executable, str(ROOT / "examples/dlrm/train.py"), "--steps", str(args.example_steps),
           "--eval-batches", str(args.eval_batches), "--out", out_dir, *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(os.path.join(out_dir, "metrics.json")) as f:
        m = json.load(f)
    shards = m["tiers"]["shards"]
    live = sum(s.get("virtual_live_ids", 0.0) for s in shards.values())
    index = sum(s.get("virtual_index_bytes", 0.0) for s in shards.values())
    return {"auc": m["auc"], "qps": m["qps"], "materialised_bytes": m["tiers"]["materialised_bytes"],
            "virtual_live_ids": live, "index_bytes_per_live_id": index / live if live else None,
            "rss_peak_bytes": max(r["VmHWM"] for r in m["tiers"]["memory"])}


def run_example(args) -> Dict[str, object]:
    cases = [("virtual", ["--virtual-tables"]), ("dense", [])]
    cases += [(f"hashed_{n}", ["--max-rows", str(n)]) for n in args.hashed_rows]
    out: Dict[str, List[Dict[str, object]]] = {name: [] for name, _ in cases}
    for rep in range(args.example_repeat):
        order = cases if rep % 2 == 0 else cases[::-1]
        for name, extra in order:
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                r = _example(args, extra + ["--seed", str(rep)], d)
            out[name].append(r)
            print(f"  repeat {rep} {name}: AUC {r['auc']:.4f}, {r['qps']:,.0f} QPS", flush=True)
    summary = {}
    base = statistics.median(r["qps"] for r in out["virtual"])
    for name, runs in out.items():
        summary[name] = {"auc": statistics.median(r["auc"] for r in runs),
                         "qps": statistics.median(r["qps"] for r in runs),
                         "qps_vs_virtual": statistics.median(r["qps"] for r in runs) / base, "runs": runs}
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="kernel,example")
    p.add_argument("--tier", default="ssd", choices=[t.value for t in Tier if t is not Tier.HBM])
    p.add_argument("--live", type=int, default=1_000_000, help="live ids (dense: rows)")
    p.add_argument("--batch", type=int, default=16384, help="ids a step")
    p.add_argument("--bag", type=int, default=8, help="ids a bag")
    p.add_argument("--steps", type=int, default=60, help="steady-state steps a case")
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--cache-fraction", type=float, default=0.1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--stage-threads", choices=("auto", "on", "off"), default="auto",
                   help="the kernels' step stages on threads (on), inline (off), or as the kernel picks")
    p.add_argument("--example-steps", type=int, default=200)
    p.add_argument("--example-repeat", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=64, help="held-out batches of the example's AUC")
    p.add_argument("--hashed-rows", type=lambda s: [int(x) for x in s.split(",")], default=[2_000, 20_000, 200_000],
                   help="--max-rows of the hashed runs")
    p.add_argument("--dir", default=None, help="working directory (table files)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    results: Dict[str, object] = {}
    parts = [x for x in args.parts.split(",") if x]
    if "kernel" in parts:
        print(f"kernel: a virtual table vs a dense table of the same {args.live:,} live rows, tier {args.tier}")
        k = results["kernel"] = run_kernel(args)
        for phase in ("first_pass", "steady"):
            r = k[phase]
            print(f"{phase}: virtual {r['virtual_steps_s']:.1f} / dense {r['dense_steps_s']:.1f} steps/s = "
                  f"{r['ratio']:.2f}x (each repeat: {', '.join(f'{x:.2f}' for x in r['ratios'])})")
        print(f"index: {k['index_bytes_per_live_id']:.1f} B of DRAM per live id")
    if "example" in parts:
        print(f"example: --virtual-tables vs --max-rows {args.hashed_rows}, {args.example_steps} steps")
        e = results["example"] = run_example(args)
        for name, r in e.items():
            runs = r["runs"]
            idx = runs[0]["index_bytes_per_live_id"]
            print(f"{name:>16}: AUC {r['auc']:.4f}  QPS {r['qps']:,.0f} ({r['qps_vs_virtual']:.2f}x of virtual)  "
                  + (f"index {idx:.1f} B/live id ({runs[0]['virtual_live_ids']:,.0f} live)  " if idx else "")
                  + "tiers hold " + ", ".join(f"{t} {b / 2**20:,.0f} MiB"
                                              for t, b in sorted(runs[0]["materialised_bytes"].items())))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
