"""What the example's input pipeline costs a rank per sample, for the planner.

The batches are made in the training loop, on the cores the rank trains on (the synthetic
generator's draws, or reading and hashing Criteo files), so their CPU time is part of every
step; the planner adds it to the dense part of the step it predicts
(``StorageAwarePlanner(input_s_per_sample=...)``).
"""

from __future__ import annotations

import itertools
import time
from typing import Iterable

import torch
import torch.distributed as dist

__all__ = ["input_seconds_per_sample"]

WARMUP_BATCHES = 1  # the first batch opens files and fills caches
TIMED_BATCHES = 8


def input_seconds_per_sample(batches: Iterable, batch_size: int) -> float:
    """CPU seconds of this thread per sample drawn from ``batches`` (``TIMED_BATCHES`` after
    ``WARMUP_BATCHES``), the largest over the process group's ranks when one is running (so
    every rank plans with the same figure: the slowest rank's input sets the pace)."""
    it = iter(batches)
    for _ in itertools.islice(it, WARMUP_BATCHES):
        pass
    t0 = time.thread_time()
    drawn = sum(1 for _ in itertools.islice(it, TIMED_BATCHES))
    seconds = (time.thread_time() - t0) / (drawn * batch_size) if drawn else 0.0
    if dist.is_available() and dist.is_initialized():
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        seconds = float(value.item())
    return seconds
