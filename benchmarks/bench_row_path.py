#!/usr/bin/env python3
"""CPU per moved row of the tiered kernel's row path, per tier, against FBGEMM and fio.

One table of 1M x 128 fp32 (``--rows``) (exact row-wise Adagrad), every row written first (so misses
read real rows), a 10% cache, Zipf 1.05 batches of 4096 x 20, prefetch pipelined. For the
SCM and SSD tiers it trains blocks of steps alternating with FBGEMM's CPU TBE (the table
whole in DRAM, the same batches) and reports:

- the row path's CPU per miss: (process CPU per step of ours - FBGEMM's) / rows loaded per
  step. Every thread counts (plan, I/O, copies); FBGEMM's own compute is taken out. This
  figure needs nothing from the kernel, so the same script measures any version of it;
- each stage's CPU ns per row as ``cache_stats()`` reports it (plan, write-back, read,
  verify, copy), where the kernel reports them;
- steps/s against FBGEMM's;
- for the SSD tier, fio's CPU per 4 KiB random read (io_uring, O_DIRECT, QD 32) on the
  same file system: the kernel's block I/O cost, below which no store's SSD miss can go.

``--compare CHECKOUT`` runs the same cases with another checkout of the repository (its
extension built in place) in a subprocess, each case alternating between the two, and
prints ours / theirs for each figure: how the row path changed between two versions.

Usage::

    python benchmarks/bench_row_path.py [--tiers scm,ssd] [--blocks N] [--block-steps N]
        [--compare CHECKOUT] [--dir DIR] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

# The repository root; --compare's subprocess imports another checkout's package instead.
_ROOT = (sys.argv[sys.argv.index("--package-root") + 1] if "--package-root" in sys.argv[:-1]
         else str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, _ROOT)

import torch  # noqa: E402

from benchmarks.bench_kernel_cost import CASES, Trainer, fbgemm, zipf_batches  # noqa: E402
from torchrec_mtrains import Tier  # noqa: E402
from torchrec_mtrains.kernels import TieredEmbeddingBags  # noqa: E402

CASE = CASES["mid_scm"]  # 1M x 128, batch 4096, pooling 20
STAGES = ("plan", "write_back", "read", "verify", "copy")
_WRITE_CHUNK = 100_000


def measure_tier(tier: Tier, args: argparse.Namespace, directory: str) -> Dict[str, float]:
    """Alternating blocks of FBGEMM and ours on one tier; the row path's figures."""
    case = dataclasses.replace(CASE, tables=((args.rows, CASE.tables[0][1]),))
    batches = zipf_batches(case, args.distinct_batches, 1.05, args.seed)
    (rows, dim), = case.tables
    ours = TieredEmbeddingBags([(rows, dim)], tier=tier, cache_rows=[rows // 10], storage_dir=directory,
                               learning_rate=0.01, prefetch_pipeline=True)
    gen = torch.Generator().manual_seed(args.seed)
    for start in range(0, rows, _WRITE_CHUNK):  # every row written: misses read real rows
        n = min(_WRITE_CHUNK, rows - start)
        ours.set_rows(0, torch.arange(start, start + n), torch.rand(n, dim, generator=gen) * 0.02 - 0.01, None)
    ours.flush()
    systems = {"ours": Trainer([(ours, [0])], 1, CASE.batch),
               "fbgemm": Trainer([(fbgemm(case.tables, 0.01), [0])], 1, CASE.batch)}
    for trainer in systems.values():
        trainer.run(batches, args.warmup_steps, 0)
    wall: Dict[str, List[float]] = {n: [] for n in systems}
    cpu: Dict[str, List[float]] = {n: [] for n in systems}
    loads: List[float] = []
    step = args.warmup_steps
    for b in range(args.blocks):
        for name in (("ours", "fbgemm") if b % 2 == 0 else ("fbgemm", "ours")):
            loaded0 = _table_stats(ours)["rows_loaded"]
            c0, w0 = time.process_time(), time.perf_counter()
            systems[name].run(batches, args.block_steps, step)
            wall[name].append((time.perf_counter() - w0) / args.block_steps)
            cpu[name].append((time.process_time() - c0) / args.block_steps)
            if name == "ours":
                loads.append((_table_stats(ours)["rows_loaded"] - loaded0) / args.block_steps)
        step += args.block_steps
    after = _table_stats(ours)  # over the whole run: set_rows and warm-up included
    ours.close()
    extra_cpu = [o - f for o, f in zip(cpu["ours"], cpu["fbgemm"])]
    out = {
        "tier": tier.name,
        "rows_loaded_per_step": statistics.median(loads),
        "ours_ms_per_step": 1e3 * statistics.median(wall["ours"]),
        "fbgemm_ms_per_step": 1e3 * statistics.median(wall["fbgemm"]),
        "ratio_vs_fbgemm": statistics.median(f / o for f, o in zip(wall["fbgemm"], wall["ours"])),
        "ours_cpu_ms_per_step": 1e3 * statistics.median(cpu["ours"]),
        "fbgemm_cpu_ms_per_step": 1e3 * statistics.median(cpu["fbgemm"]),
        "row_path_cpu_ns_per_miss": 1e9 * statistics.median(e / max(1.0, n) for e, n in zip(extra_cpu, loads)),
    }
    # Each stage's CPU per row over the measured blocks, where the kernel reports them.
    if "read_cpu_ns_per_row" in after:
        for stage in STAGES:
            out[f"{stage}_cpu_ns_per_row"] = after[f"{stage}_cpu_ns_per_row"]
        out["kernel_cpu_ns_per_miss"] = after["cpu_ns_per_miss"]
    return out


def _table_stats(module: TieredEmbeddingBags) -> Dict[str, float]:
    (stats,) = module.cache_stats().values()
    return stats


def fio_cpu_ns_per_read(directory: str, seconds: int) -> Optional[Dict[str, float]]:
    """fio's CPU per 4 KiB random read (io_uring, O_DIRECT, QD 32) on ``directory``'s file
    system, or None without fio."""
    if shutil.which("fio") is None:
        return None
    path = os.path.join(directory, "fio.dat")
    cmd = ["fio", "--name=randread", f"--filename={path}", "--size=1G", "--rw=randread", "--bs=4k",
           "--iodepth=32", "--ioengine=io_uring", "--direct=1", f"--runtime={seconds}", "--time_based",
           "--output-format=json"]
    try:
        job = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["jobs"][0]
    finally:
        if os.path.exists(path):
            os.unlink(path)
    ios = job["read"]["total_ios"]
    cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3
    return {"iops": job["read"]["iops"], "cpu_ns_per_read": 1e9 * cpu_s / max(1, ios)}


def run_other(checkout: Path, tier: str, args: argparse.Namespace) -> Dict[str, float]:
    """This script's measurement of one tier with another checkout's package, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one-tier", tier, "--blocks", str(args.blocks),
           "--block-steps", str(args.block_steps), "--warmup-steps", str(args.warmup_steps),
           "--distinct-batches", str(args.distinct_batches), "--seed", str(args.seed), "--rows", str(args.rows),
           "--package-root", str(checkout.resolve())]
    if args.dir:
        cmd += ["--dir", str(args.dir)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(r: Dict[str, float], theirs: Optional[Dict[str, float]]) -> str:
    lines = [f"{r['tier']}: {r['rows_loaded_per_step']:,.0f} misses/step; step {r['ours_ms_per_step']:.1f} ms vs "
             f"FBGEMM all-DRAM {r['fbgemm_ms_per_step']:.1f} ms = {r['ratio_vs_fbgemm']:.2f}x steps/s; "
             f"process CPU {r['ours_cpu_ms_per_step']:.1f} vs {r['fbgemm_cpu_ms_per_step']:.1f} ms/step",
             f"  row path CPU per miss (process CPU over FBGEMM's / misses): {r['row_path_cpu_ns_per_miss']:,.0f} ns"]
    if "read_cpu_ns_per_row" in r:
        lines.append("  kernel's stages, CPU ns per row: " + ", ".join(
            f"{s} {r[f'{s}_cpu_ns_per_row']:,.0f}" for s in STAGES) + f"; per miss {r['kernel_cpu_ns_per_miss']:,.0f}")
    if theirs is not None:
        lines.append(f"  vs the other checkout: row path CPU per miss {r['row_path_cpu_ns_per_miss']:,.0f} vs "
                     f"{theirs['row_path_cpu_ns_per_miss']:,.0f} ns = "
                     f"{r['row_path_cpu_ns_per_miss'] / theirs['row_path_cpu_ns_per_miss']:.2f}x; steps/s vs FBGEMM "
                     f"{r['ratio_vs_fbgemm']:.2f}x vs {theirs['ratio_vs_fbgemm']:.2f}x")
    return "\n".join(lines)


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiers", default="scm,ssd", help="comma-separated tiers of scm, ssd, dram")
    p.add_argument("--blocks", type=int, default=6, help="measured blocks per system (they alternate)")
    p.add_argument("--block-steps", type=int, default=20, help="steps per block")
    p.add_argument("--warmup-steps", type=int, default=40, help="steps per system before measuring")
    p.add_argument("--distinct-batches", type=int, default=50, help="batches generated (cycled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=CASE.tables[0][0], help="rows of the table (cache: a tenth)")
    p.add_argument("--compare", type=Path, default=None,
                   help="another checkout of the repository (extension built in place) to measure beside")
    p.add_argument("--fio-seconds", type=int, default=8, help="fio's run for the SSD floor (0: skip)")
    p.add_argument("--dir", type=Path, default=None, help="where the table files go (a temporary dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="few short blocks (a smoke run)")
    p.add_argument("--one-tier", default=None, help=argparse.SUPPRESS)  # --compare's subprocess
    p.add_argument("--package-root", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.blocks, args.block_steps, args.warmup_steps, args.distinct_batches, args.fio_seconds = 2, 3, 3, 6, 0
    if args.package_root is not None:  # measure the other checkout's package, not this one's
        import torchrec_mtrains
        if Path(torchrec_mtrains.__file__).resolve().parents[1] != Path(args.package_root).resolve():
            p.error(f"imported torchrec_mtrains from {torchrec_mtrains.__file__}, not {args.package_root}")
    tiers = [args.one_tier] if args.one_tier else [t for t in args.tiers.split(",") if t]
    unknown = [t for t in tiers if t.upper() not in ("SCM", "SSD", "DRAM")]
    if unknown or args.blocks < 1 or args.block_steps < 1:
        p.error(f"unknown tiers {unknown} (scm, ssd, dram) or non-positive --blocks/--block-steps")
    results = []
    for tier in tiers:
        theirs = run_other(args.compare, tier, args) if args.compare else None
        with tempfile.TemporaryDirectory(dir=args.dir, prefix=f"row_path_{tier}_") as d:
            r = measure_tier(Tier[tier.upper()], args, d)
            if args.one_tier:
                print(json.dumps(r))
                return 0
            if tier.upper() == "SSD" and args.fio_seconds > 0:
                r["fio"] = fio_cpu_ns_per_read(d, args.fio_seconds)
        if theirs is not None:
            r["other_checkout"] = theirs
        results.append(r)
        print(report(r, theirs), flush=True)
        if r.get("fio"):
            print(f"  fio 4 KiB random reads on the same file system: {r['fio']['cpu_ns_per_read']:,.0f} ns CPU per "
                  f"read at {r['fio']['iops']:,.0f} IOPS (the kernel's I/O path: the floor of an SSD miss)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
