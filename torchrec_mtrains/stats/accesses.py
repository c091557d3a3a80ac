"""The cache's view of a table trace: each step's distinct rows, in first-occurrence order."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from torchrec_mtrains.stats.types import TableTrace

__all__ = ["step_accesses"]


def step_accesses(trace: TableTrace) -> Tuple[np.ndarray, np.ndarray]:
    """Each step's distinct ids, step after step, in order of first occurrence in the step.

    This is what the kernel's row cache sees: a step's duplicate ids are one access.

    Returns:
        ``(ids, step_offsets)``: int64 [m] accesses and int64 [steps + 1] offsets into them.
    """
    ids, offsets = trace.ids, trace.step_offsets
    steps = offsets.size - 1
    if ids.size == 0:
        return ids.astype(np.int64), np.zeros(steps + 1, dtype=np.int64)
    step_of = np.repeat(np.arange(steps, dtype=np.int64), np.diff(offsets))
    uniq, dense = np.unique(ids, return_inverse=True)
    key = step_of * np.int64(uniq.size) + dense.astype(np.int64)
    _, first = np.unique(key, return_index=True)
    first.sort()  # first occurrences in trace order: steps stay in order
    counts = np.bincount(step_of[first], minlength=steps)
    out_offsets = np.zeros(steps + 1, dtype=np.int64)
    np.cumsum(counts, out=out_offsets[1:])
    return ids[first].astype(np.int64, copy=False), out_offsets
