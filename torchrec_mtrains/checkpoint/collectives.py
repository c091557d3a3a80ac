"""The collectives of a checkpoint save or restore, on the default group -- or, in a thread
within ``on_group(group)``, on that group (a save in the background has a group of its own,
since training's collectives go on meanwhile). A process without a default group is a world
of one rank. Every rank calls each of them, in the same order."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_sum", "barrier", "current_group", "gather_errors", "on_group", "rank", "world_size"]

_local = threading.local()


@contextlib.contextmanager
def on_group(group: Optional[Any]) -> Iterator[None]:
    """Within (in this thread): the collectives run on ``group`` (None: the default one)."""
    previous = getattr(_local, "group", None)
    _local.group = group
    try:
        yield
    finally:
        _local.group = previous


def current_group() -> Optional[Any]:
    return getattr(_local, "group", None)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier(group=current_group())


def all_gather(value: Any) -> List[Any]:
    """Every rank's ``value`` (picklable), in rank order."""
    if not dist.is_initialized():
        return [value]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=current_group())
    return out


def all_sum(values: List[int]) -> List[int]:
    """The element-wise sum of every rank's ``values``."""
    t = torch.tensor(values, dtype=torch.int64)
    if dist.is_initialized():
        dist.all_reduce(t, group=current_group())
    return [int(v) for v in t]


def gather_errors(error: Optional[str]) -> List[str]:
    """Every rank's error (what failed where), so that all ranks fail together."""
    return [e for e in all_gather(error) if e is not None]
