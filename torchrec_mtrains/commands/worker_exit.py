"""How a worker process of a multi-rank gloo job ends: once every rank is past its last
collective, without tearing the group down.

Under load, a rank that destroyed its gloo group (or let the interpreter's teardown destroy
it) while a peer still finished the last barrier's messages aborted in gloo's destructors
("terminate called without an active exception"). So the ranks agree through the group's
store that all are past their collectives and leaving (rank 0 serves the store, so it leaves
last), and each process then exits with ``os._exit``.
"""

from __future__ import annotations

import os
import sys

__all__ = ["all_past_their_collectives", "exit_worker"]


def all_past_their_collectives(prefix: str = "worker_exit") -> None:
    """Returns once every rank of the default group is past its last collective and every
    other rank is leaving. Keys go under ``prefix`` in the group's store."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"{prefix}/past/{rank}", "1")
    store.wait([f"{prefix}/past/{r}" for r in range(world)])
    if rank:
        store.set(f"{prefix}/leaving/{rank}", "1")  # its last word: the store may go next
    else:
        store.wait([f"{prefix}/leaving/{r}" for r in range(1, world)])


def exit_worker(code: int = 0) -> None:
    """Ends this worker process with ``code``: a group of one rank is destroyed as usual; a
    multi-rank one is left as the module says. Standard streams are flushed first."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() > 1:
            all_past_their_collectives()
        else:
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
