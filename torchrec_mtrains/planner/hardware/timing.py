"""Timing helpers of ``mtrains probe-hw``'s compute figures: the clock a step is timed by
and the least-squares fit that turns step times into per-unit costs."""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["nonneg_fit", "step_clock"]


def step_clock() -> Callable[[], float]:
    """The clock a compute step is timed by, in seconds: with one torch thread (one core
    per rank, where the work runs on the calling thread) the calling thread's CPU time,
    which other processes' load on a shared machine does not inflate; with more threads
    (work on torch's pool threads too) the wall clock."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def nonneg_fit(points: Sequence[Tuple[Sequence[float], float]],
               scales: Optional[Sequence[float]] = None) -> List[float]:
    """Non-negative least squares of ``y = x . coef`` over ``(x, y)`` points: a coefficient
    that comes out negative (noise) is fixed at 0 and the others refitted. ``scales``: each
    point's residual is divided by its scale (e.g. the step time it was measured against,
    whose noise grows with it), so a long step's jitter does not outweigh a short step."""
    xs = np.array([x for x, _ in points], dtype=np.float64)
    ys = np.array([y for _, y in points], dtype=np.float64)
    if scales is not None:
        w = 1.0 / np.array(scales, dtype=np.float64)
        xs, ys = xs * w[:, None], ys * w
    active = list(range(xs.shape[1]))
    coef = np.zeros(xs.shape[1])
    while active:
        sol = np.linalg.lstsq(xs[:, active], ys, rcond=None)[0]
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return [float(c) for c in coef]
