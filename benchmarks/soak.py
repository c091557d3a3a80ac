#!/usr/bin/env python3
"""Soak (not in CI): train one SSD-tier table with a tiny cache for a long time and
check that memory and file size stay flat, and tell a leak from allocator fragmentation.

TieredEmbeddingBags on Tier.SSD (default 2M rows x 64 fp32, cache 0.5% of the rows, Zipf
1.05, batch 2048 x 20, prefetch pipeline on, a flush every 200 steps). Every --every seconds
it samples the process RSS, the table file's allocated bytes, the step time and the store's
write amplification, and glibc's heap figures (``mallinfo2``: bytes in use by malloc
callers -- Python, torch, the C++ store alike -- and bytes the heap holds free), and with
``--tracemalloc`` the Python allocations by line; at the end it compares the last half of the run with its first
sample after warm-up and prints PASS/MISS for "flat" (growth under 5%).

    .venv/bin/python benchmarks/soak.py --minutes 60 --dir /mnt/nvme [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Dict

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


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _malloc_mib() -> Dict[str, float]:
    """glibc's heap: bytes handed out (``in_use``: small blocks + mmapped large ones) and
    bytes held free inside the arenas (``free``). RSS growing with ``in_use`` flat is the
    allocator's fragmentation, not a leak. Empty where glibc has no ``mallinfo2``."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    return {"malloc_in_use_mib": (m.uordblks + m.hblkhd) / 2**20, "malloc_free_mib": m.fordblks / 2**20}


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
    p.add_argument("--tracemalloc", action="store_true",
                   help="trace Python allocations: print the lines whose memory grew most since warm-up")
    args = p.parse_args(argv)
    if args.tracemalloc:
        tracemalloc.start(8)
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
        samples, steps, step_times, warm_snapshot = [], 0, [], None
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
                    **_malloc_mib(),
                    **({"python_traced_mib": tracemalloc.get_traced_memory()[0] / 2**20} if args.tracemalloc else {}),
                })
                s = samples[-1]
                print(f"t={s['t_s']:>7.0f}s steps={steps:>7} rss={s['rss_mib']:>8.1f} MiB "
                      f"file={s['file_mib']:>8.1f} MiB step={s['step_ms']:>6.1f} ms wa={s['write_amplification']:.2f}"
                      + "".join(f" {k[:-4]}={v:.1f}" for k, v in s.items() if k.startswith(("malloc", "python"))),
                      flush=True)
                if args.tracemalloc and len(samples) == 2:
                    warm_snapshot = tracemalloc.take_snapshot()
                next_sample += args.every
        emb.close()
    if warm_snapshot is not None:
        print("Python allocations that grew most since the second sample (tracemalloc):")
        for stat in tracemalloc.take_snapshot().compare_to(warm_snapshot, "lineno")[:10]:
            print(f"  {stat}")
    if len(samples) < 4:
        print("too few samples: run longer")
        return 1
    base = samples[max(1, len(samples) // 4)]  # after warm-up (the cache and the log fill)
    tail = samples[len(samples) // 2:]
    ok = True
    for key in [k for k in ("rss_mib", "file_mib", "malloc_in_use_mib", "python_traced_mib") if k in base]:
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
