"""The collectives of a checkpoint save or restore, on the default group: a process without
one is a world of one rank. Every rank calls each of them, in the same order."""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_sum", "barrier", "gather_errors", "rank", "world_size"]


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather(value: Any) -> List[Any]:
    """Every rank's ``value`` (picklable), in rank order."""
    if not dist.is_initialized():
        return [value]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_sum(values: List[int]) -> List[int]:
    """The element-wise sum of every rank's ``values``."""
    t = torch.tensor(values, dtype=torch.int64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return [int(v) for v in t]


def gather_errors(error: Optional[str]) -> List[str]:
    """Every rank's error (what failed where), so that all ranks fail together."""
    return [e for e in all_gather(error) if e is not None]
