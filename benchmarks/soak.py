#!/usr/bin/env python3
"""Soak (not in CI): train one SSD-tier table with a tiny cache for a long time and
check that memory and file size stay flat.

TieredEmbeddingBags on Tier.SSD (default 2M rows x 64 fp32, cache 0.5% of the rows, Zipf
1.05, batch 2048 x 20, prefetch pipeline on, a flush every 200 steps). Every --every seconds
it samples the process RSS, the table file's allocated bytes, the step time and the store's
write amplification; at the end it compares the last half of the run with its first
sample after warm-up and prints PASS/MISS for "flat" (growth under 5%).

    .venv/bin/python benchmarks/soak.py --minutes 60 --dir /mnt/nvme [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--cache-fraction", type=float, default=0.005)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--pooling", type=int, default=20)
    p.add_argument("--zipf-alpha", type=float, default=1.05)
    p.add_argument("--flush-every", type=int, default=200, help="steps between flush() calls")
    p.add_argument("--dir", default=None, help="where the table file goes (default: a temp dir)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    pr = np.arange(1, args.rows + 1, dtype=np.float64) ** -args.zipf_alpha
    cdf = np.cumsum(pr) / pr.sum()
    perm = rng.permutation(args.rows)
    pool = [torch.from_numpy(perm[np.minimum(np.searchsorted(cdf, rng.random(args.batch * args.pooling)),
                                             args.rows - 1)]) for _ in range(64)]
    offsets = torch.arange(0, args.batch * args.pooling + 1, args.pooling)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        emb = TieredEmbeddingBags([(args.rows, args.dim)], tier=Tier.SSD, storage_dir=d,
                                  cache_rows=max(1, int(args.cache_fraction * args.rows)))
        path = os.path.join(d, f"{emb.table_names[0]}.blk")
        samples, steps, step_times = [], 0, []
        t_end = time.monotonic() + args.minutes * 60
        next_sample = time.monotonic()
        emb.prefetch(pool[0], offsets)
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            emb.prefetch(pool[(steps + 1) % len(pool)], offsets)
            emb(pool[steps % len(pool)], offsets).sum().backward()
            steps += 1
            if steps % args.flush_every == 0:
                emb.flush()
            step_times.append(time.perf_counter() - t0)
            if time.monotonic() >= next_sample:
                stats = emb.store_stats(0)
                samples.append({
                    "t_s": round(args.minutes * 60 - (t_end - time.monotonic()), 1), "steps": steps,
                    "rss_mib": _rss_bytes() / 2**20, "file_mib": _allocated(path) / 2**20,
                    "step_ms": 1e3 * statistics.median(step_times[-50:]),
                    "write_amplification": float(stats.get("write_amplification", float("nan"))),
                })
                s = samples[-1]
                print(f"t={s['t_s']:>7.0f}s steps={steps:>7} rss={s['rss_mib']:>8.1f} MiB "
                      f"file={s['file_mib']:>8.1f} MiB step={s['step_ms']:>6.1f} ms wa={s['write_amplification']:.2f}",
                      flush=True)
                next_sample += args.every
        emb.close()
    if len(samples) < 4:
        print("too few samples: run longer")
        return 1
    base = samples[max(1, len(samples) // 4)]  # after warm-up (the cache and the log fill)
    tail = samples[len(samples) // 2:]
    ok = True
    for key in ("rss_mib", "file_mib"):
        growth = max(s[key] for s in tail) / base[key] - 1
        flat = growth < 0.05
        ok &= flat
        print(f"{key}: {base[key]:.1f} at t={base['t_s']:.0f}s -> max {max(s[key] for s in tail):.1f} in the last "
              f"half: {growth:+.1%}  [{'PASS' if flat else 'MISS'}] flat (< 5% growth)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "samples": samples}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
