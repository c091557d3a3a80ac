#!/usr/bin/env python3
"""Trace-statistics benchmark: time to build LRU/LFU curves for a ~10M-access Zipf
trace, exact (stack distances) vs SHARDS-sampled, and the hit-rate error of each curve
against the real cache (csrc SetAssociativeCache, replayed on the same trace) at 1/5/10/20%
cache sizes. Every figure, baseline included, is measured in this run."""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np
import yaml

from torchrec_mtrains.stats import (
    SyntheticTable,
    TableTrace,
    generate_dlrm_batch,
    lfu_curve,
    lru_curve,
    replay_cache_hit_rate,
    step_accesses,
    trace_from_dlrm_batches,
)

CONFIG = pathlib.Path(__file__).with_name("configs") / "stats.yaml"


def load_config(path: pathlib.Path, quick: bool) -> dict:
    cfg = yaml.safe_load(path.read_text())
    overlay = cfg.pop("quick", {}) or {}
    if quick:
        cfg.update(overlay)
    return cfg


def make_trace(cfg: dict) -> TableTrace:
    """One stationary Zipf trace (one generator call, so one rank -> row mapping) with about
    ``target_accesses`` cache accesses; the steps needed are estimated from a 50-step pilot."""
    table = SyntheticTable(cfg["rows"], float(cfg["pooling"]), zipf_alpha=cfg["zipf_alpha"])

    def steps_of(n: int, seed: int) -> TableTrace:
        batch = generate_dlrm_batch([table], cfg["batch"] * n, seed=seed)
        return trace_from_dlrm_batches([batch], batch_size=cfg["batch"], num_rows=[cfg["rows"]]).tables["table_0"]

    pilot = step_accesses(steps_of(50, cfg["seed"] + 1))[0].size / 50
    return steps_of(int(np.ceil(cfg["target_accesses"] / pilot)), cfg["seed"])


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=pathlib.Path, default=CONFIG)
    parser.add_argument("--quick", action="store_true", help="small trace (smoke run)")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.quick)
    trace, t_gen = timed(lambda: make_trace(cfg))
    (acc, offsets), t_dedupe = timed(lambda: step_accesses(trace))
    print(f"trace: {trace.ids.size:,} lookups, {trace.num_steps:,} steps of {cfg['batch']} samples x "
          f"{cfg['pooling']} ids, {acc.size:,} cache accesses (distinct rows per step), Zipf {cfg['zipf_alpha']} "
          f"over {cfg['rows']:,} rows (generated in {t_gen:.1f} s)")
    print(f"step dedupe (shared by every curve): {t_dedupe:.2f} s")
    exact, t_exact = timed(lambda: lru_curve(acc, offsets))
    print(f"LRU exact (stack distances):       {t_exact:7.2f} s   (baseline)")
    sampled = {}
    for rate in cfg["sample_rates"]:
        sampled[rate], t = timed(lambda: lru_curve(acc, offsets, sample_rate=rate, seed=cfg["seed"]))
        print(f"LRU SHARDS rate {rate:<5}:            {t:7.2f} s   ({t_exact / t:.1f}x faster than exact)")
    lfu, t_lfu = timed(lambda: lfu_curve(acc))
    print(f"LFU perfect:                       {t_lfu:7.2f} s")
    print()
    head = "cache   real LRU  exact LRU (err)    " + "  ".join(f"SHARDS {r} (err)" for r in cfg["sample_rates"])
    print(head + "    real LFU  perfect LFU (err)   replay s")
    for share in cfg["cache_shares"]:
        c = int(share * cfg["rows"])
        (real, real_lfu), t_replay = timed(lambda: (replay_cache_hit_rate(trace, c, "lru", cfg["ways"]),
                                                    replay_cache_hit_rate(trace, c, "lfu", cfg["ways"])))
        e = exact.hit_rate(c)
        cols = "  ".join(f"{sampled[r].hit_rate(c):6.1%} ({(sampled[r].hit_rate(c) - real) * 100:+.2f})"
                         for r in cfg["sample_rates"])
        print(f"{share:5.0%}   {real:7.1%}  {e:7.1%} ({(e - real) * 100:+.2f})    {cols}    "
              f"{real_lfu:7.1%}  {lfu.hit_rate(c):7.1%} ({(lfu.hit_rate(c) - real_lfu) * 100:+.2f})   {t_replay:6.1f}")
    print("\nerr: curve minus the real cache's hit rate, in points (LFU columns against the real LFU cache).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
