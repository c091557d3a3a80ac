#!/usr/bin/env python3
"""The Adam family on tiered tables against exact row-wise Adagrad: step cost and tier reads.

Two targets, each against ``EXACT_ROWWISE_ADAGRAD`` (FBGEMM's fused update) on the same
table and the same Zipf batches (``bench_kernel_cost.zipf_batches``):

1. ``step``: a training step (prefetch + forward + backward with the update) of a table all
   in the cache (Tier.DRAM, cache_rows >= rows; a warm-up pass over every distinct batch
   caches each row the measured steps use) with ADAM, PARTIAL_ROWWISE_ADAM, LAMB and
   PARTIAL_ROWWISE_LAMB (the kernel's C++ update in the backward, ``adam_family.py``). Each
   optimizer is measured beside row-wise Adagrad in rounds that alternate (ABAB..., the
   order flipping each round); per optimizer: the median step time of the rounds and the
   median of the rounds' ratios (optimizer / Adagrad). Target: ADAM <= 1.3x.
2. ``ssd``: the same batches on a Tier.SSD table, every row written first, with a cache
   smaller than the table, for row-wise Adagrad and ADAM: rows read from the tier per
   looked-up (unique) row from ``cache_stats()`` (identical: same ids, same cache), and the
   bytes per stored row (``TableLayout.row_bytes``) against the bytes the kernel and the
   block store read per row read.

Usage::

    python benchmarks/bench_adam.py [--rows N] [--dim D] [--batch B] [--pooling L]
        [--sequence] [--rounds N] [--round-steps N] [--optimizers adam,lamb,...]
        [--ssd-rows N] [--ssd-cache-factor F] [--skip-ssd] [--dir DIR] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import torch  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode  # noqa: E402

from benchmarks.bench_kernel_cost import Batch, Case, Trainer, zipf_batches  # noqa: E402
from torchrec_mtrains import Tier  # noqa: E402
from torchrec_mtrains.kernels import TieredEmbeddingBags  # noqa: E402
from torchrec_mtrains.layout import TableLayout  # noqa: E402

BASELINE = EmbOptimType.EXACT_ROWWISE_ADAGRAD
OPTIMIZERS = {o.name.lower(): o for o in (EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_ADAM,
                                          EmbOptimType.LAMB, EmbOptimType.PARTIAL_ROWWISE_LAMB)}
STEP_TARGET = 1.3  # ADAM step / row-wise Adagrad step, at most
_FILL_CHUNK = 100_000


def _kernel(args: argparse.Namespace, optimizer: EmbOptimType, rows: int, tier: Tier, cache_rows: int,
            directory: str) -> TieredEmbeddingBags:
    return TieredEmbeddingBags(
        [(rows, args.dim)], tier=tier, cache_rows=cache_rows, storage_dir=directory, optimizer=optimizer,
        learning_rate=args.learning_rate, seed=args.seed,
        pooling_mode=PoolingMode.NONE if args.sequence else PoolingMode.SUM)


def _stats(kernel: TieredEmbeddingBags) -> Dict[str, float]:
    (stats,) = kernel.cache_stats().values()
    return dict(stats)


def _state_mib(args: argparse.Namespace, optimizer: EmbOptimType, rows: int) -> float:
    return rows * TableLayout(args.dim, "fp32", optimizer).state_bytes / 2**20


def step_cost(args: argparse.Namespace, batches: List[Batch], directory: str) -> Dict[str, Any]:
    """Target 1: each optimizer beside row-wise Adagrad in alternating rounds, all cached."""
    rows, steps = args.rows, args.round_steps
    case_batch = args.batch

    def trainer(optimizer: EmbOptimType) -> Trainer:
        kernel = _kernel(args, optimizer, rows, Tier.DRAM, rows, f"{directory}/{optimizer.name.lower()}")
        t = Trainer([(kernel, [0])], 1, case_batch)
        t.run(batches, len(batches), 0)  # every distinct batch once: each row the steps use is cached
        return t

    def reset(t: Trainer) -> Dict[str, float]:
        t.phase_seconds = dict.fromkeys(t.phase_seconds, 0.0)
        t.steps_timed = 0
        return _stats(t.kernels[0][0])

    base = trainer(BASELINE)
    out: Dict[str, Any] = {"optimizers": {}}
    for name in args.optimizers:
        ours = trainer(OPTIMIZERS[name])
        pair = {"base": base, "ours": ours}
        before = {k: reset(t) for k, t in pair.items()}
        wall: Dict[str, List[float]] = {"base": [], "ours": []}
        cpu: Dict[str, List[float]] = {"base": [], "ours": []}
        start = 0
        for r in range(args.rounds):
            for key in (("base", "ours") if r % 2 == 0 else ("ours", "base")):
                gc.collect()
                c0, w0 = time.process_time(), time.perf_counter()
                pair[key].run(batches, steps, start)
                wall[key].append((time.perf_counter() - w0) / steps)
                cpu[key].append((time.process_time() - c0) / steps)
            start = (start + steps) % len(batches)
        hit = {}
        for key, t in pair.items():
            after = _stats(t.kernels[0][0])
            unique = after["unique_rows"] - before[key]["unique_rows"]
            hit[key] = (after["hits"] - before[key]["hits"]) / unique if unique else float("nan")
        measured = args.rounds * steps
        out["optimizers"][name] = {
            "ms_per_step": 1e3 * statistics.median(wall["ours"]),
            "baseline_ms_per_step": 1e3 * statistics.median(wall["base"]),
            "ratio": statistics.median(o / b for o, b in zip(wall["ours"], wall["base"])),
            "cpu_ms_per_step": 1e3 * statistics.median(cpu["ours"]),
            "baseline_cpu_ms_per_step": 1e3 * statistics.median(cpu["base"]),
            "round_ratios": [o / b for o, b in zip(wall["ours"], wall["base"])],
            "hit_rate": hit["ours"], "baseline_hit_rate": hit["base"],
            "phase_ms_per_step": {k: 1e3 * v / measured for k, v in ours.phase_seconds.items()},
            "baseline_phase_ms_per_step": {k: 1e3 * v / measured for k, v in base.phase_seconds.items()},
            "state_mib": _state_mib(args, OPTIMIZERS[name], rows),
        }
        ours.kernels[0][0].close()
        del ours, pair
        gc.collect()
    base.kernels[0][0].close()
    out["baseline_state_mib"] = _state_mib(args, BASELINE, rows)
    adam = out["optimizers"].get("adam")
    out["target"] = STEP_TARGET
    out["pass"] = None if adam is None else adam["ratio"] <= STEP_TARGET
    return out


def ssd_reads(args: argparse.Namespace, directory: str) -> Dict[str, Any]:
    """Target 2: rows and bytes read from an SSD table (cache smaller than the table) by
    row-wise Adagrad and ADAM over the same batches."""
    rows, cache_rows = args.ssd_rows, max(1, int(args.ssd_rows * args.ssd_cache_factor))
    case = Case("adam_ssd", ((rows, args.dim),), args.batch, args.pooling, None)
    batches = zipf_batches(case, args.ssd_steps, args.zipf_alpha, args.seed + 1)
    out: Dict[str, Any] = {"rows": rows, "cache_rows": cache_rows, "steps": args.ssd_steps, "optimizers": {}}
    for optimizer in (BASELINE, EmbOptimType.ADAM):
        kernel = _kernel(args, optimizer, rows, Tier.SSD, cache_rows, f"{directory}/ssd_{optimizer.name.lower()}")
        gen = torch.Generator().manual_seed(args.seed)
        for start in range(0, rows, _FILL_CHUNK):  # every row written: misses read the device
            n = min(_FILL_CHUNK, rows - start)
            kernel.set_rows(0, torch.arange(start, start + n), torch.rand(n, args.dim, generator=gen) * 0.02 - 0.01)
        kernel.flush()
        before, store0 = _stats(kernel), kernel.store_stats(0)
        Trainer([(kernel, [0])], 1, args.batch).run(batches, len(batches), 0)
        after, store1 = _stats(kernel), kernel.store_stats(0)
        kernel.close()
        d = {k: after[k] - before[k] for k in ("lookups", "unique_rows", "misses", "rows_loaded", "bytes_read_from_tier")}
        s = {k: float(store1[k]) - float(store0[k]) for k in ("rows_read", "disk_rows_read", "device_bytes_read")}
        out["optimizers"][optimizer.name.lower()] = {
            **d, **{f"store_{k}": v for k, v in s.items()},
            "misses_per_unique_row": d["misses"] / d["unique_rows"],
            "row_bytes": TableLayout(args.dim, "fp32", optimizer).row_bytes,
            "tier_bytes_per_row_read": d["bytes_read_from_tier"] / d["rows_loaded"] if d["rows_loaded"] else 0.0,
            "device_bytes_per_disk_row": s["device_bytes_read"] / s["disk_rows_read"] if s["disk_rows_read"] else 0.0,
        }
    a, b = out["optimizers"]["adam"], out["optimizers"][BASELINE.name.lower()]
    out["misses_ratio"] = a["misses"] / b["misses"] if b["misses"] else float("nan")
    out["row_bytes_ratio"] = a["row_bytes"] / b["row_bytes"]
    out["pass"] = a["misses"] == b["misses"] and a["tier_bytes_per_row_read"] == a["row_bytes"]
    return out


def report_step(r: Dict[str, Any], args: argparse.Namespace) -> str:
    mode = "sequences of" if args.sequence else "pooling"
    lines = [f"step cost: {args.rows:,} rows x {args.dim} fp32, Tier.DRAM all cached, batch {args.batch:,} x {mode} "
             f"{args.pooling}, Zipf {args.zipf_alpha}; {args.rounds} alternating rounds x {args.round_steps} steps; "
             f"torch threads {torch.get_num_threads()}",
             f"  {'optimizer':<22}{'ms/step':>9}{'adagrad':>9}{'ratio':>7}{'fwd ms':>8}{'bwd ms':>8}"
             f"{'adagrad bwd':>12}{'hit rate':>9}{'state MiB':>10}"]
    for name, o in r["optimizers"].items():
        lines.append(f"  {name:<22}{o['ms_per_step']:>9.2f}{o['baseline_ms_per_step']:>9.2f}{o['ratio']:>7.2f}"
                     f"{o['phase_ms_per_step']['forward']:>8.2f}{o['phase_ms_per_step']['backward']:>8.2f}"
                     f"{o['baseline_phase_ms_per_step']['backward']:>12.2f}{o['hit_rate']:>9.3f}{o['state_mib']:>10.0f}")
    for name, o in r["optimizers"].items():
        target = f"  target <= {r['target']}x  [{'PASS' if r['pass'] else 'MISS'}]" if name == "adam" else ""
        lines.append(f"ratio step {name} / exact_rowwise_adagrad = {o['ratio']:.2f}x{target}")
    return "\n".join(lines)


def report_ssd(r: Dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"SSD reads: {r['rows']:,} rows x {args.dim} fp32, every row written, cache {r['cache_rows']:,} rows, "
             f"{r['steps']} steps of the same Zipf batches",
             f"  {'optimizer':<22}{'unique':>10}{'misses':>10}{'miss/row':>9}{'row B':>7}{'tier B/row':>11}"
             f"{'store rows':>11}{'disk rows':>10}{'dev B/row':>10}"]
    for name, o in r["optimizers"].items():
        lines.append(f"  {name:<22}{o['unique_rows']:>10,.0f}{o['misses']:>10,.0f}{o['misses_per_unique_row']:>9.4f}"
                     f"{o['row_bytes']:>7}{o['tier_bytes_per_row_read']:>11.0f}{o['store_rows_read']:>11,.0f}"
                     f"{o['store_disk_rows_read']:>10,.0f}"
                     f"{o['device_bytes_per_disk_row']:>10.0f}")
    lines.append(f"ratio ssd misses adam / exact_rowwise_adagrad = {r['misses_ratio']:.4f}x; row bytes "
                 f"{r['row_bytes_ratio']:.2f}x  [{'PASS' if r['pass'] else 'MISS'}]")
    return "\n".join(lines)


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the all-cached table (step cost)")
    p.add_argument("--dim", type=int, default=128, help="fp32 weights per row")
    p.add_argument("--batch", type=int, default=4096, help="bags per step")
    p.add_argument("--pooling", type=int, default=20, help="ids per bag")
    p.add_argument("--sequence", action="store_true", help="unpooled lookups (PoolingMode.NONE)")
    p.add_argument("--zipf-alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                   help=f"comma-separated optimizers of {', '.join(OPTIMIZERS)} (each against row-wise Adagrad)")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per optimizer")
    p.add_argument("--round-steps", type=int, default=10, help="steps per round and system")
    p.add_argument("--distinct-batches", type=int, default=40, help="batches generated (cycled; the warm-up runs each)")
    p.add_argument("--ssd-rows", type=int, default=400_000, help="rows of the SSD table")
    p.add_argument("--ssd-cache-factor", type=float, default=0.1, help="SSD table's cache as a share of its rows")
    p.add_argument("--ssd-steps", type=int, default=20, help="steps on the SSD table per optimizer")
    p.add_argument("--skip-step", action="store_true", help="do not measure the step cost")
    p.add_argument("--skip-ssd", action="store_true", help="do not run the SSD table")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=None, help="where the table files go (a temporary dir under it)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="a tiny table and few steps (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.batch, args.pooling = 20_000, 32, 256, 8
        args.rounds, args.round_steps, args.distinct_batches = 2, 2, 4
        args.ssd_rows, args.ssd_steps = 20_000, 4
    args.optimizers = [o for o in args.optimizers.split(",") if o]
    unknown = [o for o in args.optimizers if o not in OPTIMIZERS]
    if unknown or args.rounds < 1 or args.round_steps < 1 or args.distinct_batches < 1:
        p.error(f"unknown optimizers {unknown} (known: {', '.join(OPTIMIZERS)}) or non-positive "
                "--rounds/--round-steps/--distinct-batches")
    torch.manual_seed(args.seed)
    results: Dict[str, Any] = {"command": " ".join(sys.argv if argv is None else ["bench_adam.py", *argv])}
    work = tempfile.mkdtemp(dir=args.dir, prefix="bench_adam_")
    try:
        if not args.skip_step:
            case = Case("adam_step", ((args.rows, args.dim),), args.batch, args.pooling, None)
            batches = zipf_batches(case, args.distinct_batches, args.zipf_alpha, args.seed)
            results["step"] = step_cost(args, batches, work)
            print(report_step(results["step"], args), flush=True)
        if not args.skip_ssd:
            results["ssd"] = ssd_reads(args, work)
            print(report_ssd(results["ssd"], args), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
