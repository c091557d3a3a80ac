#!/usr/bin/env python3
"""Planner benchmark: the perf model against measured steps, planning time, and
nodes needed with all tiers vs HBM + DRAM only on the model suite.

1. Perf model: one table (default 1M x 64 fp32, batch 2048 x pooling 20, Zipf 1.05) trained
   with FBGEMM all in DRAM and with TieredEmbeddingBags on SCM and SSD (10% and 2% caches,
   the table fully written first, the prefetch pipeline on, one training thread, predicted
   as the one rank on this machine, whose worker threads have the other cores; the
   cases take turns in blocks of steps, so a slow spell of a shared machine hits them alike); the
   median step time against the step the perf model predicts from a hardware profile
   measured by `mtrains probe-hw --quick --table-size <the table's bytes>` at the start of
   the same run (the disk's speed drifts between runs) or from a given profile (target: within 20%).
2. Planning time of the 1,000-table models (target: under 30 s each): `thousand_tables`
   (6.47 TiB, tables repeated by `count:`) and `thousand_tables_23tb` (~23 TB, every table
   its own size and locality curve, a capacity-bound target), from reading MODEL.yaml to
   both node counts; curves are computed afresh (the first use of each model in the run).
3. `mtrains plan` on the model suite in benchmarks/configs/models/ with the `gpu-scm-node`
   profile: nodes with all tiers vs HBM + DRAM only (target: >= 4x, aim 8x).

    .venv/bin/python benchmarks/bench_planner.py [--quick] [--hardware local] [--dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.planner import load_model_spec, load_topology, parse_model_spec
from torchrec_mtrains.planner.model.estimator import step_seconds, table_cost
from torchrec_mtrains.planner.model.sizing import plan_report

MODELS = Path(__file__).parent / "configs" / "models"
PLANNING_MODELS = ("thousand_tables", "thousand_tables_23tb")  # section 2
PLANNING_GOAL_S = 30.0
PERF_MODEL_GOAL = 0.20  # section 1: predicted / measured within [1 / 1.2, 1.2]


def _batches(rows: int, lookups: int, alpha: float, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(p) / p.sum()
    perm = rng.permutation(rows)
    return [torch.from_numpy(perm[np.minimum(np.searchsorted(cdf, rng.random(lookups)), rows - 1)]) for _ in range(steps)]


def _fbgemm(rows: int, dim: int):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01,
    )
    with torch.no_grad():
        tbe.split_embedding_weights()[0].uniform_(-0.01, 0.01)
    return tbe


def _tiered(tier: Tier, rows: int, dim: int, cache_rows: int, directory: str):
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    kernel = TieredEmbeddingBags([(rows, dim)], tier=tier, cache_rows=cache_rows, storage_dir=directory,
                                 learning_rate=0.01)
    chunk = 1 << 17
    for lo in range(0, rows, chunk):  # every row written: misses really reach the device
        ids = torch.arange(lo, min(rows, lo + chunk))
        kernel.set_rows(0, ids, torch.empty(ids.numel(), dim).uniform_(-0.01, 0.01))
    kernel.flush()
    return kernel


def _step_times(module, batches, offsets, prefetch: bool) -> list:
    """Seconds of each training step over ``batches`` (the next one prefetched while a step
    computes, when ``prefetch``); every batch prefetched here is consumed here."""
    times = []
    if prefetch:
        module.prefetch(batches[0], offsets)
    for i, idx in enumerate(batches):
        t0 = time.perf_counter()
        if prefetch and i + 1 < len(batches):
            module.prefetch(batches[i + 1], offsets)
        module(idx, offsets).sum().backward()
        times.append(time.perf_counter() - t0)
    return times


def _measured_profile(directory: str, table_bytes: int) -> str:
    """A quick probe whose tier tables are as large as the benchmark's (a smaller file's
    random reads are partly served by caches below the filesystem: 2x the IOPS here)."""
    from torchrec_mtrains.commands import probe_hw

    path = str(Path(directory) / "measured.yaml")
    if probe_hw.main(["--quick", "--table-size", str(table_bytes), "--dir", directory, "--out", path]) != 0:
        raise SystemExit("probe-hw failed")
    return path


def perf_model(args) -> list:
    rows, dim, batch, pf, alpha = args.rows, args.dim, args.batch, args.pooling, args.zipf_alpha
    spec = parse_model_spec({"batch_size": batch, "target_qps": 1.0, "tables": [
        {"name": "t", "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": pf, "zipf_alpha": alpha}]})
    table = spec.tables[0]
    topo = load_topology(args.hardware if args.hardware != "measure"
                         else _measured_profile(args.dir or tempfile.gettempdir(), int(table.bytes)))
    # The cases run as the only process on the machine: one rank, whose kernel's worker
    # threads have the cores its single training thread leaves (the profile's
    # ranks_per_node would charge them to a core shared with another rank's compute).
    topo = dataclasses.replace(topo, ranks_per_node=1)
    batches = _batches(rows, batch * pf, alpha, args.warmup + args.steps)
    offsets = torch.arange(0, batch * pf + 1, pf)
    cases = [("FBGEMM, all in DRAM", Tier.DRAM, 0.0)] + [
        (f"{tier.name}, cache {frac:.0%}", tier, frac) for tier in (Tier.SCM, Tier.SSD) for frac in (0.1, 0.02)]
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        modules = []
        for i, (name, tier, frac) in enumerate(cases):
            if frac == 0:
                module, prefetch = _fbgemm(rows, dim), False
            else:
                sub = os.path.join(d, f"case{i}")  # each case its own table files
                os.makedirs(sub)
                module, prefetch = _tiered(tier, rows, dim, int(frac * rows), sub), True
            _step_times(module, batches[:args.warmup], offsets, prefetch)  # warm the cache
            modules.append((module, prefetch))
        # The cases take turns in blocks (each round in another order), so a slow spell of
        # the shared machine falls on all of them rather than on whichever ran then.
        times = [[] for _ in cases]
        per_block = max(1, args.steps // args.blocks)
        for r in range(args.blocks):
            block = batches[args.warmup + r * per_block:args.warmup + (r + 1) * per_block]
            for i in (range(len(cases)) if r % 2 == 0 else reversed(range(len(cases)))):
                times[i] += _step_times(modules[i][0], block, offsets, modules[i][1])
        for (name, tier, frac), (module, _), measured in zip(cases, modules, times):
            hit = None
            if frac:
                hit = next(iter(module.cache_stats().values()))["hit_rate"]
                module.close()
            cost = table_cost(table, tier, frac * rows, topo, batch)
            predicted = step_seconds(cost.compute_s, cost.io_s, 0.0)
            results.append((name, statistics.median(measured), predicted, hit, cost.hit_rate))
        del modules
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="measure",
                        help="profile the perf model reads: 'measure' (default) runs `mtrains probe-hw --quick` (tier tables as large as this one) "
                             "first, in this run, since the disk's speed drifts between runs; or a name / YAML")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pooling", type=int, default=20)
    parser.add_argument("--zipf-alpha", type=float, default=1.05)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per case, in --blocks turns")
    parser.add_argument("--blocks", type=int, default=3, help="turns the cases take, alternating")
    parser.add_argument("--dir", default=None, help="where the SCM/SSD files go (default: the temp dir)")
    parser.add_argument("--quick", action="store_true", help="smaller table and fewer steps")
    parser.add_argument("--skip-perf", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.warmup, args.steps = 200_000, 10, 10
    torch.set_num_threads(1)  # one rank of the profile: 1 thread
    ok = True
    if not args.skip_perf:
        print(f"1. perf model vs measured ({args.rows:,} x {args.dim} fp32, batch {args.batch} x {args.pooling}, "
              f"Zipf {args.zipf_alpha}, profile {args.hardware}, 1 thread)")
        print(f"   {'case':<22}{'measured ms':>12}{'predicted ms':>13}{'pred/meas':>10}{'hit meas':>9}{'hit pred':>9}")
        for name, measured, predicted, hit, hit_pred in perf_model(args):
            ratio = predicted / measured
            within = 1 / (1 + PERF_MODEL_GOAL) <= ratio <= 1 + PERF_MODEL_GOAL
            ok &= within
            hits = f"{hit:>9.1%}{hit_pred:>9.1%}" if hit is not None else f"{'':>9}{'':>9}"
            print(f"   {name:<22}{measured * 1e3:>12.1f}{predicted * 1e3:>13.1f}{ratio:>10.2f}{hits}"
                  f"  [{'PASS' if within else 'MISS'}] within {PERF_MODEL_GOAL:.0%}")
    print("\n   Sections 2 and 3 plan only (no training): their models and the gpu-scm-node profile need GPU "
          "nodes\n   this machine does not have, so nothing is measured beside their predictions. The example "
          "DLRM\n   prints its predicted QPS beside the measured one (scripts/run_example.sh, "
          "benchmarks/bench_example.py).")
    print(f"\n2. planning time on gpu-scm-node (read MODEL.yaml, placement + sizing, both tier sets; "
          f"goal < {PLANNING_GOAL_S:.0f} s)")
    for name in PLANNING_MODELS:
        t0 = time.perf_counter()
        model = load_model_spec(str(MODELS / f"{name}.yaml"))
        report = plan_report(model, load_topology("gpu-scm-node"), 100_000)
        took = time.perf_counter() - t0
        print(f"   {name:<22}{len(report['tables']):>5} tables {model.embedding_bytes / 1e12:>6.2f} TB  "
              f"{report['target_qps']:>9,.0f} QPS  nodes {report['nodes']:>2} vs {report['nodes_hbm_ddr_only']:>2}  "
              f"{took:>6.1f} s  [{'PASS' if took < PLANNING_GOAL_S else 'MISS'}]")
    print("\n3. nodes on gpu-scm-node, all tiers vs HBM + DRAM only (goal >= 4x, aim 8x)")
    for path in sorted(MODELS.glob("*.yaml")):
        model = load_model_spec(str(path))
        r = plan_report(model, load_topology("gpu-scm-node"), 100_000)
        ratio = r["node_ratio"] or 0.0
        print(f"   {path.stem:<18}{len(model.tables):>5} tables {model.embedding_bytes / 2**40:>6.2f} TiB  "
              f"{r['target_qps']:>10,.0f} QPS  nodes {r['nodes']:>3} vs {r['nodes_hbm_ddr_only']:>3}  "
              f"= {ratio:.2f}x  [{'PASS' if ratio >= 4 else 'MISS'}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
