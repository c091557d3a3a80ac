"""LRU stack (reuse) distances of a step trace in one pass, and SHARDS spatial sampling.

The kernel's cache locks a step's resident rows before any of its misses picks a victim, so
a row is a hit iff it was cached *before* its step. An LRU cache of ``C`` rows holds, after
a step, the ``C`` most recently used distinct rows (a step's rows ordered by first
occurrence). So the access at position ``i`` of step ``s`` (first position ``S``), whose
row was last accessed at position ``j``, hits in a cache of ``C`` rows iff

    d(i) = 1 + |{distinct rows whose last access before S lies in (j, S)}| <= C.

``d`` is computed with a Fenwick tree over access positions holding 1 at each row's latest
access: ``d = 1 + seen_rows - prefix(j)``. A step's queries all read the state before the
step and its updates follow, so every Fenwick operation is vectorised over a step (numpy;
O(m log m) for m accesses, ~log m numpy calls per step).

SHARDS (Waldspurger et al., FAST'15): keep only rows with ``hash(row) mod P < T``
(rate ``R = T / P``), compute distances on that sub-trace and scale them by ``1 / R``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COLD", "shards_mask", "stack_distances"]

COLD = np.iinfo(np.int64).max
"""Distance of a first access (a compulsory miss at every cache size)."""

_SHARDS_MODULUS = 1 << 24  # P: sampling granularity of the hash


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def shards_mask(ids: np.ndarray, rate: float, seed: int = 0) -> np.ndarray:
    """Bool mask of the ids SHARDS keeps at ``rate``: ``hash(id) mod 2^24 < rate * 2^24``.

    Whole rows are kept or dropped (spatial sampling), so a kept row keeps all its accesses.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate={rate!r} must be in (0, 1]")
    threshold = np.uint64(max(1, round(rate * _SHARDS_MODULUS)))
    h = _splitmix64(ids.astype(np.int64).view(np.uint64) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    return (h & np.uint64(_SHARDS_MODULUS - 1)) < threshold


def stack_distances(ids: np.ndarray, step_offsets: np.ndarray) -> np.ndarray:
    """LRU stack distance of each access of a step trace (see the module docstring).

    Args:
        ids: int64 [m] accesses: each step's distinct rows (see ``step_accesses``).
        step_offsets: int64 [steps + 1] offsets of the steps in ``ids``.

    Returns:
        int64 [m]: the smallest LRU cache (rows) in which the access hits; ``COLD`` for a
        row's first access.
    """
    m = ids.size
    dist = np.full(m, COLD, dtype=np.int64)
    if m == 0:
        return dist
    # Previous access of the same row (-1: none), from one stable sort.
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    same = sorted_ids[1:] == sorted_ids[:-1]
    prev = np.full(m, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    tree = np.zeros(m + 1, dtype=np.int64)  # Fenwick, 1-based positions
    seen = 0
    bounds = step_offsets.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi == lo:
            continue
        p = prev[lo:hi]
        has = p >= 0
        jp = p[has]
        if jp.size:
            # prefix(j): latest accesses at positions <= j.
            pos = jp + 1
            acc = np.zeros(jp.size, dtype=np.int64)
            while True:
                live = pos > 0
                if not live.any():
                    break
                acc += tree[pos]  # tree[0] == 0
                pos &= pos - 1
            dist[lo:hi][has] = 1 + seen - acc
        # Updates: a row's old latest access leaves, this step's accesses enter.
        upd = np.concatenate([jp + 1, np.arange(lo + 1, hi + 1, dtype=np.int64)])
        delta = np.concatenate([np.full(jp.size, -1, dtype=np.int64), np.ones(hi - lo, dtype=np.int64)])
        while upd.size:
            np.add.at(tree, upd, delta)
            upd = upd + (upd & -upd)
            keep = upd <= m
            upd, delta = upd[keep], delta[keep]
        seen += (hi - lo) - jp.size
    return dist
