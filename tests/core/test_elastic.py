"""torchrec_mtrains.elastic.init_process_group: a restarted attempt never reads the keys a
previous attempt left in torchrun's shared store (the cause of the restart hang in
docs/reliability.md)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.ports import OS_PICKED_PORT, master_store
from torchrec_mtrains.elastic import init_process_group

WORLD = 2


def _worker(rank: int, port: int, attempt: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RESTART_COUNT=str(attempt))
    init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30))
    t = torch.tensor([float(rank + 1 + 10 * attempt)])
    dist.all_reduce(t)
    out.put((attempt, rank, t.item()))
    out.close()
    out.join_thread()  # the result is in the pipe before the process goes
    # No destroy_process_group: a killed attempt leaves its keys and sockets behind. And no
    # normal exit either: tearing down a live gloo group whose peer is already gone can
    # abort in gloo's destructors ("terminate called without an active exception").
    os._exit(0)


@pytest.mark.multiprocess
def test_restarted_attempts_get_keys_of_their_own() -> None:
    # The agent's store: it outlives every attempt, as torchrun's shared store does.
    agent_store = master_store(timeout=timedelta(seconds=30))
    port = agent_store.port
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    for attempt in range(3):
        procs = [ctx.Process(target=_worker, args=(r, port, attempt, out)) for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"attempt {attempt}: worker exit {p.exitcode}"
        got = sorted(out.get(timeout=10) for _ in range(WORLD))
        assert got == [(attempt, r, 3.0 + 20 * attempt) for r in range(WORLD)]


def test_without_torchelastic_it_is_the_plain_env_init(monkeypatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", OS_PICKED_PORT)  # one rank: it binds the port, nobody connects
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    init_process_group("gloo", rank=0, world_size=1)
    try:
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
