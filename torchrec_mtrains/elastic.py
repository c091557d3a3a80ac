"""Worker-side helpers for torchrun jobs: a process group that survives restarts, and a
worker that ends when its agent is gone.

torchrun (torch 2.13, c10d rendezvous) keeps one TCPStore for the whole job and hands it to
every attempt's workers (``TORCHELASTIC_USE_AGENT_STORE=True``), while
``init_process_group`` keys the default group the same way in every attempt. Keys written
by a killed attempt (gloo's per-rank addresses among them) are still in the store when the
restarted workers look them up: a worker may read a dead peer's address and fail with
"connection refused", or both wait forever in gloo's connectFullMesh. Prefixing the store
with the attempt number gives each attempt keys of its own.

torchrun also starts each worker in a session of its own, so a worker outlives its agent
(OOM-killed, SIGKILLed, its node agent restarted) and trains on as an orphan, writing to the
same tier files and checkpoint directory as the job restarted beside it.
``exit_when_agent_dies`` ends such a worker within about a second.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Optional, Tuple

import torch.distributed as dist

__all__ = ["ORPHAN_EXIT_CODE", "exit_when_agent_dies", "init_process_group", "stop_if_orphaned"]

ORPHAN_EXIT_CODE = 75
"""Exit status of a worker that stopped because its torchrun agent was gone (EX_TEMPFAIL)."""


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


_watched: Optional[Tuple[int, str]] = None  # (agent pid, what) once exit_when_agent_dies ran


def exit_when_agent_dies(what: str = "worker", poll_seconds: float = 0.5) -> Optional[threading.Thread]:
    """Under torchrun, ends this process once its agent (its parent) is gone.

    A daemon thread compares the parent pid with the agent's every ``poll_seconds``; when the
    worker has been re-parented it prints one line naming the agent and exits at once with
    ``ORPHAN_EXIT_CODE`` (``os._exit``: no atexit handlers, no flushes, no further writes; what
    was in flight is what a crash leaves, and the job's crash safety covers it). A thread, not
    ``PR_SET_PDEATHSIG``, so that the worker can say why it stopped even while its main thread
    waits in a collective. A peer that stopped first makes this worker's collective fail
    before the thread looks: call ``stop_if_orphaned`` where such an error is caught. Works
    under torchx's local scheduler, which starts torchrun.

    Args:
        what: names this process in the message (e.g. "train.py rank 1").
        poll_seconds: how often the parent is checked (seconds, > 0).

    Returns:
        The watching thread, or None outside torchrun (no ``TORCHELASTIC_RUN_ID``).
    """
    global _watched
    if not poll_seconds > 0:
        raise ValueError(f"poll_seconds={poll_seconds!r} must be > 0")
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    _watched = (os.getppid(), what)
    if _watched[0] == 1:  # re-parented to init already: the agent died before we looked
        _leave()

    def watch() -> None:
        while os.getppid() == _watched[0]:
            time.sleep(poll_seconds)
        _leave()

    thread = threading.Thread(target=watch, name="mtrains-agent-watch", daemon=True)
    thread.start()
    return thread


def stop_if_orphaned() -> None:
    """Exits as the watching thread would if this worker's agent is gone; else returns.
    A no-op unless ``exit_when_agent_dies`` is watching."""
    if _watched is not None and os.getppid() != _watched[0]:
        _leave()


def _leave() -> None:
    agent, what = _watched
    sys.stderr.write(f"\n{what}: its torchrun agent (pid {agent}) is gone; stopping now, writing nothing more\n")
    sys.stderr.flush()
    os._exit(ORPHAN_EXIT_CODE)
