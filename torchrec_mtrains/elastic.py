"""A process group that survives torchrun restarts.

torchrun (torch 2.13, c10d rendezvous) keeps one TCPStore for the whole job and hands it to
every attempt's workers (``TORCHELASTIC_USE_AGENT_STORE=True``), while
``init_process_group`` keys the default group the same way in every attempt. Keys written
by a killed attempt (gloo's per-rank addresses among them) are still in the store when the
restarted workers look them up: a worker may read a dead peer's address and fail with
"connection refused", or both wait forever in gloo's connectFullMesh. Prefixing the store
with the attempt number gives each attempt keys of its own.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

__all__ = ["init_process_group"]


def init_process_group(backend: str, rank: int, world_size: int,
                       timeout: Optional[timedelta] = None) -> None:
    """``dist.init_process_group`` with a store of this attempt's own under torchrun.

    Outside torchelastic, or when the agent does not share its store, this is the plain
    env:// initialisation.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store_timeout = timeout or timedelta(minutes=30)  # gloo's default
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world_size,
                          is_master=False, timeout=store_timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"mtrains/attempt_{attempt}/", store), rank=rank,
                            world_size=world_size, timeout=timeout)
