"""Cache policies side by side: each policy's hit rate on an i.i.d. Zipf trace and on a
drifting one, next to Belady's optimum and the best static cache on the same trace.

The hit rates come from replaying a trace through the row-cache index alone
(``torch.classes.mtrains.SetAssociativeCache``: no TBE, no tier), planned as the kernel's
prefetch pipeline plans it: step i is planned while step i-1 is still live (its rows
locked). A hit is a step's distinct row found cached (``cache_stats()``'s definition),
counted after the warm-up steps.

Traces (same rows, lookups per step and steps as the kernel benchmark's main workload):

- ``zipf``: the main workload's batches (i.i.d. Zipf(alpha) over shuffled ids). Best static
  cache: the most probable rows (no online policy beats it in expectation).
- ``drift``: Zipf(alpha) ranks over half the rows whose ids move as in
  ``torchrec_mtrains.stats.synthetic`` (``drifted_ids``): each step a share ``drift`` of the
  ranks moves to a fresh id, so yesterday's hot rows cool down. Best static cache: the
  rows most used over the counted steps (in hindsight).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.lib.belady import OptResult, belady_hits, static_hits
from benchmarks.lib.lookahead import replay_window
from benchmarks.lib.types import CACHE_POLICIES, KernelBenchConfig, PhaseResult
from torchrec_mtrains.kernels.config import DEFAULTS

__all__ = ["POLICY_TRACES", "PolicyTrace", "compare_policies", "drift_trace", "replay_hits"]

POLICY_TRACES = ("zipf", "drift")
"""Traces of the policy comparison, in report order."""


@dataclass(frozen=True)
class PolicyTrace:
    """One trace of the comparison.

    Attributes:
        name: "zipf" or "drift".
        steps: Each step's ids (int64 numpy arrays).
        warmup: Steps before the first counted one.
        static_rows: The best static cache's rows (as many as the cache has slots).
        label: How the report names the trace.
    """

    name: str
    steps: list[np.ndarray]
    warmup: int
    static_rows: np.ndarray
    label: str


def replay_hits(steps: Sequence[np.ndarray], capacity: int, ways: int, policy: str,
                count_from_step: int = 0, lookahead: int = 0) -> OptResult:
    """Hit rate of ``SetAssociativeCache(capacity, ways, policy)`` on ``steps``.

    Each step is planned with the previous one still live (the prefetch pipeline), in eval
    mode (no write-backs: they do not change which rows are cached), with the next
    ``lookahead`` steps announced (the kernel's look-ahead window: lookahead.replay_window).

    Returns:
        Hits and distinct rows of the steps from ``count_from_step`` on.
    """
    r = replay_window(steps, capacity, ways, policy, count_from_step, lookahead)
    return OptResult(r.hits, r.accesses, int(capacity), count_from_step)


def drift_trace(cfg: KernelBenchConfig, seed: int) -> PolicyTrace:
    """The drifting Zipf trace: ``warmup_steps + blocks * block_steps`` steps of
    ``lookups_per_step`` ids (see the module docstring)."""
    from torchrec_mtrains.stats.synthetic import drifted_ids

    rng = np.random.default_rng(seed)
    ranks_n = max(1, cfg.rows // 2)  # fresh ids for every move (the pool holds twice the ranks)
    pool = rng.permutation(cfg.rows).astype(np.int64)
    phase = rng.random(ranks_n)
    cdf = np.cumsum(np.arange(1, ranks_n + 1, dtype=np.float64) ** -cfg.zipf_alpha)
    cdf /= cdf[-1]
    total = cfg.warmup_steps + cfg.blocks * cfg.block_steps
    steps = []
    for step in range(total):
        ranks = np.minimum(np.searchsorted(cdf, rng.random(cfg.lookups_per_step), side="right"), ranks_n - 1)
        steps.append(drifted_ids(pool, phase, cfg.drift, step, ranks))
    counted = np.concatenate([np.unique(s) for s in steps[cfg.warmup_steps:]])
    ids, counts = np.unique(counted, return_counts=True)
    top = ids[np.argsort(-counts, kind="stable")[:_capacity(cfg)]]
    return PolicyTrace("drift", steps, cfg.warmup_steps, top,
                       f"drifting Zipf {cfg.zipf_alpha} ({cfg.drift:.1%} of the ranks move per step)")


def _capacity(cfg: KernelBenchConfig) -> int:
    return max(1, int(np.ceil(cfg.rows * cfg.cache_load_factor)))


def compare_policies(cfg: KernelBenchConfig, zipf_steps: list[np.ndarray], zipf_order: np.ndarray,
                     log: Callable[[str], None] = print) -> list[PhaseResult]:
    """Every policy (``CACHE_POLICIES``) on both traces, with the references.

    Args:
        cfg: Benchmark settings (rows, cache_load_factor, drift, seed ...).
        zipf_steps: The main workload's steps (i.i.d. Zipf(cfg.zipf_alpha)).
        zipf_order: Its ids by rank (most probable first).
        log: Progress lines.

    Returns:
        Per trace, a "policy_replay" result per policy (phase ``<trace>_<policy>``) and a
        "policy_reference" one (phase ``<trace>``: Belady and the best static cache).
    """
    capacity = _capacity(cfg)
    zipf = PolicyTrace("zipf", zipf_steps, cfg.warmup_steps, zipf_order[:capacity],
                       f"i.i.d. Zipf {cfg.zipf_alpha}")
    out: list[PhaseResult] = []
    for make in (lambda: zipf, lambda: drift_trace(cfg, cfg.seed + 2)):
        trace = make()
        log(f"policy hit rates on the {trace.label} trace ({len(trace.steps)} steps, {capacity:,} rows) ...")
        for policy in CACHE_POLICIES:
            t0 = time.perf_counter()
            r = replay_hits(trace.steps, capacity, DEFAULTS.cache_ways, policy, trace.warmup)
            out.append(PhaseResult("policy_replay", f"{trace.name}_{policy}", r.accesses, time.perf_counter() - t0,
                                   None, {"trace": trace.name, "cache_algorithm": policy, "hit_rate": r.hit_rate,
                                          "hits": r.hits, "capacity": capacity}))
        t0 = time.perf_counter()
        opt = belady_hits(trace.steps, capacity, trace.warmup)
        static = static_hits(trace.steps, trace.static_rows, trace.warmup)
        out.append(PhaseResult("policy_reference", trace.name, opt.accesses, time.perf_counter() - t0, None,
                               {"trace": trace.name, "label": trace.label, "hit_rate": opt.hit_rate,
                                "static_hit_rate": static.hit_rate, "capacity": capacity,
                                "counted_from_step": trace.warmup, "steps": len(trace.steps)}))
    return out


