"""Hit rates of the row cache with a look-ahead window of k batches, on step traces.

A trace is replayed through the cache index alone (``torch.classes.mtrains.SetAssociativeCache``:
no TBE, no tier) as the kernel's step engine drives it with ``lookahead=k``: every step is
announced (``reserve``) k steps before its plan, step i is planned with step i-1 still live,
in eval mode (write-backs do not change which rows are cached). A hit is a step's distinct
row found cached (``cache_stats()``'s definition), counted after the warm-up steps. The
cache's capacity after the run is reported too: slots past the nominal ones are the
overflow pool, the DRAM the window's locked rows cost beyond the cache.

Traces:
- ``zipf``: the kernel benchmark's main workload (benchmarks/lib/kernel_steps.make_batches:
  i.i.d. Zipf(alpha) over shuffled ids).
- ``realistic``: tables of the example DLRM (examples/dlrm/data.py) whose ids follow Meta's
  dlrm_datasets reuse histogram with the example's drift, the global batch of its two
  ranks per step (a table-wise table's rank sees all of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LookaheadTrace", "WindowResult", "realistic_trace", "replay_window"]


@dataclass(frozen=True)
class LookaheadTrace:
    """A table's step trace and its cache.

    Attributes:
        name: How the report names it.
        steps: Each step's ids (int64 arrays).
        warmup: Steps before the first counted one.
        capacity: Cache slots.
        static_rows: The best static cache's rows (the most probable ones), or None.
    """

    name: str
    steps: list[np.ndarray]
    warmup: int
    capacity: int
    static_rows: np.ndarray | None = None


@dataclass(frozen=True)
class WindowResult:
    """One replay: hits and distinct rows counted, and the cache's slots at the end."""

    hits: int
    accesses: int
    capacity: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else float("nan")


def replay_window(steps: Sequence[np.ndarray], capacity: int, ways: int, policy: str, warmup: int,
                  lookahead: int) -> WindowResult:
    """The cache's hits over ``steps[warmup:]`` with a window of ``lookahead`` steps (0: none)."""
    import torch

    from torchrec_mtrains._ops import load_extension

    load_extension()
    cache = torch.classes.mtrains.SetAssociativeCache(int(capacity), int(ways), policy)
    tensors = [torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)) for ids in steps]
    n = len(tensors)
    if lookahead:
        for ahead in range(min(lookahead, n - 1) + 1):
            cache.reserve(tensors[ahead], ahead)
    before = dict(cache.counters())
    for step, ids in enumerate(tensors):
        if step == warmup:
            before = dict(cache.counters())
        cache.plan(ids, step, max(0, step - 1), False)
        if lookahead and step + lookahead + 1 < n:
            cache.reserve(tensors[step + lookahead + 1], step + lookahead + 1)
    after = dict(cache.counters())
    return WindowResult(after["hits"] - before["hits"], after["unique_rows"] - before["unique_rows"],
                        int(cache.capacity()))


def realistic_trace(table: str, steps: int, warmup: int, working_set_share: float, global_batch: int = 1024,
                    drift: float = 0.01, seed: int = 0) -> LookaheadTrace:
    """The example DLRM's table ``table`` (examples/dlrm/data.py DEFAULT_TABLES), ``steps``
    steps of ``global_batch`` samples, a cache of ``working_set_share`` x the rows it draws
    from (its working set: a cache of the whole of it misses only the rows the drift brings)."""
    from examples.dlrm.data import DEFAULT_TABLES, table_sampler

    spec = next((t for t in DEFAULT_TABLES if t.name == table), None)
    if spec is None:
        raise ValueError(f"table={table!r} is not one of the example's {[t.name for t in DEFAULT_TABLES]}")
    sampler = table_sampler(spec, seed, drift)
    rng = np.random.default_rng(seed)
    trace = [sampler.sample(rng, global_batch, step)[1].astype(np.int64) for step in range(steps)]
    capacity = max(1, int(np.ceil(sampler.ranks * working_set_share)))
    kind = f"Zipf {spec.zipf_alpha}" if spec.zipf_alpha is not None else "dlrm_datasets histogram"
    return LookaheadTrace(f"{table} ({spec.num_rows:,} rows, {kind}, drift {drift})", trace, warmup, capacity)
