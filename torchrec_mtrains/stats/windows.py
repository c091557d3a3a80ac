"""Distinct ids over windows of consecutive steps: the live ids a table keeps when its ids
are evicted once unused for a window (a virtual table's TTL).

The count of window ``[a, a + W)`` is the number of its lookups that are the first of their
id in the window: a lookup at step ``s`` of an id last looked up at an earlier step ``p``
(-1: never) is first in exactly the windows that start in ``[max(p + 1, s - W + 1), s]``. A
lookup whose id the same step already looked up adds an empty range. One stable sort of the
ids finds each lookup's ``p``; a difference array over the window starts sums the ranges:
O(n log n) for n ids, linear in memory.
"""

from __future__ import annotations

import numpy as np

from torchrec_mtrains.stats.types import TableTrace

__all__ = ["distinct_ids_in_windows"]


def distinct_ids_in_windows(trace: TableTrace, window_steps: int) -> int:
    """The most distinct ids any ``window_steps`` consecutive steps of ``trace`` look up.

    Only whole windows count (a window cut short by the trace's end is inside a whole one).
    ``window_steps >= trace.num_steps``: the whole trace's distinct ids.

    Args:
        trace: one table's ids per step (raw ids: any int64 values).
        window_steps: steps in a window (>= 1).

    Raises:
        ValueError: ``window_steps`` not a positive integer.
    """
    if isinstance(window_steps, bool) or not isinstance(window_steps, (int, np.integer)) or window_steps < 1:
        raise ValueError(f"window_steps={window_steps!r} must be a positive integer")
    ids, steps = trace.ids, trace.num_steps
    if ids.size == 0:
        return 0
    if window_steps >= steps:
        ordered = np.sort(ids)  # np.unique takes several times as long on tens of millions of ids
        return 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))
    window = int(window_steps)
    dtype = np.int32 if steps < np.iinfo(np.int32).max else np.int64
    order = np.argsort(ids, kind="stable")  # each id's lookups together, in step order
    step = np.repeat(np.arange(steps, dtype=dtype), np.diff(trace.step_offsets))[order]
    ordered = ids[order]
    del order
    same = ordered[1:] == ordered[:-1]
    del ordered
    first = np.empty_like(step)  # first window start counting the lookup: max(p + 1, s - W + 1)
    first[0] = 0
    np.add(step[:-1], 1, out=first[1:])
    first[1:][~same] = 0
    del same
    np.maximum(first, step - (window - 1), out=first)
    keep = first <= step
    delta = np.bincount(first[keep], minlength=steps + 1)
    delta -= np.bincount(step[keep] + 1, minlength=steps + 1)
    return int(np.cumsum(delta)[: steps - window + 1].max())
