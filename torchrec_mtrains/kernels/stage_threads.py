"""Whether a kernel's step engine runs its stages on threads of their own, when the user
leaves it to the kernel (``prefetch_pipeline=None``).

The engine's plan and move threads overlap a step's plan and tier moves with the compute of
the step before. That pays when the moves wait on a device (SSD reads and writes), or when
the node has cores to spare beside torch's intra-op threads. On a node whose cores those
threads already fill, a kernel whose tiers are all memory (DRAM, SCM: its moves are CPU
copies) has nothing to overlap but CPU work, and its threads contend with FBGEMM's OpenMP
threads, which spin at their barriers: the step is then faster with every stage run inline,
in ``prefetch()`` (docs/kernels.md, "Stage threads or inline").
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from torchrec_mtrains.types import Tier

__all__ = ["cpus_per_rank", "stage_threads_pay"]


def cpus_per_rank() -> int:
    """The CPUs this process may run on, shared among the ranks of its node
    (``LOCAL_WORLD_SIZE``, as torchrun sets it)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, cpus // ranks)


def stage_threads_pay(tiers: Sequence[Tier]) -> bool:
    """Stage threads for a kernel of these tables' tiers: always with an SSD table (its moves
    wait on the device), else only where this rank's CPUs outnumber torch's threads."""
    if any(t is Tier.SSD for t in tiers):
        return True
    return cpus_per_rank() > torch.get_num_threads()
