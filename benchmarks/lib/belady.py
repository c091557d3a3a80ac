"""Reference hit rates of a row cache on a step trace: Belady's optimum and two yardsticks.

- :func:`belady_hits`: Belady's offline optimal (OPT / MIN), the upper bound.
- :func:`lru_hits`: exact LRU, fully associative (what the set-associative LRU approximates).
- :func:`static_hits`: a cache that always holds one fixed set of rows, e.g. the most probable
  ones: under independent draws (the synthetic Zipf traces) that is the best any online
  policy can do in expectation (the "A0" policy), so it shows how much of the gap to
  Belady is reachable at all.

The trace is the training steps' distinct rows. The cache is fully associative with
``capacity`` rows and demand-filled (every accessed row is brought in, as the kernel's
cache does); on a miss with the cache full, OPT evicts the cached row whose next use lies
farthest in the future (never used again counts as farthest). Within a step its distinct
rows are accessed once each, in ascending id order, so "hit" means the row was cached
before the step -- the definition of ``TieredEmbeddingBags.cache_stats()``'s hits. The
optimal cache may evict a row the same step used earlier (the kernel locks those), so this
is an upper bound for any policy of that size.

Implementation: next-use positions from one stable argsort (numpy), then one pass with a
max-heap of next-use positions and lazy deletion: an entry is live while it is the row's
current next use. Rows never used again need no heap entry (any of them is a best
victim), so the Zipf tail costs one counter update per access.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["OptResult", "belady_hits", "lru_hits", "next_use", "static_hits"]


@dataclass(frozen=True)
class OptResult:
    """A policy's figures over the counted steps.

    Attributes:
        hits: Accesses (distinct rows of a step) that found their row cached.
        accesses: Accesses counted (sum of the counted steps' distinct rows).
        capacity: Cache rows.
        counted_from_step: First counted step (earlier steps only warm the cache).
    """

    hits: int
    accesses: int
    capacity: int
    counted_from_step: int

    @property
    def hit_rate(self) -> float:
        """hits / accesses (NaN when nothing was counted)."""
        return self.hits / self.accesses if self.accesses else float("nan")


def next_use(trace: np.ndarray) -> np.ndarray:
    """For each position of ``trace``, the position of the next access to the same id.

    Args:
        trace: int64 [n] ids.

    Returns:
        int64 [n]; ``n`` (past the end) where the id is not accessed again.
    """
    n = trace.size
    order = np.argsort(trace, kind="stable")
    ids = trace[order]
    same = ids[1:] == ids[:-1]
    nxt = np.full(n, n, dtype=np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def belady_hits(steps: Sequence[np.ndarray], capacity: int, count_from_step: int = 0) -> OptResult:
    """Simulates OPT over the steps' distinct rows.

    Args:
        steps: Per step, its ids (duplicates are dropped; rows are accessed in ascending
            order).
        capacity: Cache rows (>= 1).
        count_from_step: Steps before this one warm the cache but are not counted.

    Returns:
        Hits and accesses of the counted steps.

    Raises:
        ValueError: ``capacity`` < 1 or ``count_from_step`` outside ``[0, len(steps)]``.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    if not 0 <= count_from_step <= len(steps):
        raise ValueError(f"count_from_step must be in [0, {len(steps)}], got {count_from_step!r}")
    uniq = [np.unique(np.asarray(s, dtype=np.int64)) for s in steps]
    if not uniq or sum(u.size for u in uniq) == 0:
        return OptResult(0, 0, int(capacity), count_from_step)
    trace = np.concatenate(uniq)
    n = trace.size
    start = int(sum(u.size for u in uniq[:count_from_step]))
    _, dense = np.unique(trace, return_inverse=True)  # ids -> 0..U-1
    hits = _simulate(dense.tolist(), next_use(trace).tolist(), int(dense.max()) + 1, int(capacity), n, start)
    return OptResult(hits, n - start, int(capacity), count_from_step)


def _simulate(trace: list[int], nxt: list[int], num_ids: int, capacity: int, n: int, start: int) -> int:
    """The OPT pass; returns the hits at positions >= ``start``."""
    current = [-1] * num_ids  # a cached row's next use; -1: not cached (or never used again)
    heap: list[int] = []  # -(next use) of cached rows that are used again; stale entries skipped
    dead = 0  # cached rows never used again: the first victims
    size = 0
    hits = 0
    push, pop = heapq.heappush, heapq.heappop
    for i in range(n):
        row = trace[i]
        if current[row] == i:  # cached, and this is the use its entry waited for
            if i >= start:
                hits += 1
        else:
            if size == capacity:
                if dead:
                    dead -= 1
                else:
                    while True:
                        victim_next = -pop(heap)
                        victim = trace[victim_next]
                        if current[victim] == victim_next:
                            current[victim] = -1
                            break
                size -= 1
            size += 1
        j = nxt[i]
        if j < n:
            current[row] = j
            push(heap, -j)
        else:
            current[row] = -1
            dead += 1
    return hits


def lru_hits(steps: Sequence[np.ndarray], capacity: int, count_from_step: int = 0) -> OptResult:
    """Exact fully associative LRU over the steps' distinct rows (same accesses and hit
    definition as :func:`belady_hits`)."""
    import collections

    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    cache: "collections.OrderedDict[int, None]" = collections.OrderedDict()
    hits = accesses = 0
    for s, ids in enumerate(steps):
        counted = s >= count_from_step
        for row in np.unique(np.asarray(ids, dtype=np.int64)).tolist():
            if row in cache:
                cache.move_to_end(row)
                hits += counted
            else:
                cache[row] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
            accesses += counted
    return OptResult(hits, accesses, int(capacity), count_from_step)


def static_hits(steps: Sequence[np.ndarray], cached: np.ndarray, count_from_step: int = 0) -> OptResult:
    """A cache holding exactly the rows ``cached`` (its capacity) throughout."""
    cached = np.unique(np.asarray(cached, dtype=np.int64))
    hits = accesses = 0
    for ids in steps[count_from_step:]:
        u = np.unique(np.asarray(ids, dtype=np.int64))
        hits += int(np.isin(u, cached, assume_unique=True).sum())
        accesses += u.size
    return OptResult(hits, accesses, int(cached.size), count_from_step)
