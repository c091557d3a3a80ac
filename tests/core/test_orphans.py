"""A torchrun worker whose agent is gone stops (torchrec_mtrains.elastic.exit_when_agent_dies):
torchrun starts each worker in a session of its own, so killing the agent alone used to leave
both workers training on as orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import List

import pytest

from tests.support.crash_helpers import fault_trace, torchrun_cmd, torchrun_env
from torchrec_mtrains.elastic import exit_when_agent_dies

WORKERS_GONE_S = 30  # the bound on how long orphans may outlive their agent
HANG_GUARD_S = 300  # only against a hang: the job reaches its steps in seconds


def _children(pid: int) -> List[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    try:
        with open(path) as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped
    except FileNotFoundError:
        return False


def _steps_reached(trace: str) -> int:
    return sum(1 for line in fault_trace(trace) if line[0] == "step")


def test_outside_torchrun_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert exit_when_agent_dies() is None
    with pytest.raises(ValueError, match="poll_seconds"):
        exit_when_agent_dies(poll_seconds=0)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_workers_stop_when_the_torchrun_agent_is_killed_alone(tmp_path) -> None:
    storage, ckpt, out, trace = (str(tmp_path / n) for n in ("storage", "ckpt", "out", "trace"))
    cmd = torchrun_cmd(storage, ckpt, out, "--steps", "100000", max_restarts=0)
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        agent = subprocess.Popen(cmd, env=torchrun_env(MTRAINS_FAULT_TRACE=trace), stdout=subprocess.DEVNULL,
                                 stderr=err, start_new_session=True)
    workers: List[int] = []
    try:
        # Both ranks training: each has reached its "step" fault point at least twice.
        deadline = time.monotonic() + HANG_GUARD_S
        while _steps_reached(trace) < 4:
            assert agent.poll() is None, f"the job ended early ({agent.returncode}): {err_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(0.2)
        workers = _children(agent.pid)
        assert len(workers) == 2, f"expected 2 workers under the agent, found {workers}"
        os.kill(agent.pid, signal.SIGKILL)  # the agent alone: the workers are in sessions of their own
        agent.wait()
        killed_at = time.monotonic()
        while any(_alive(w) for w in workers) and time.monotonic() - killed_at < WORKERS_GONE_S:
            time.sleep(0.2)
        survivors = [w for w in workers if _alive(w)]
        assert not survivors, f"workers {survivors} outlived their agent by {WORKERS_GONE_S} s"
        stopped = _steps_reached(trace)
        time.sleep(1.0)  # nothing can write any more: the trace must not grow
        assert _steps_reached(trace) == stopped
        text = err_path.read_text()
        for rank in (0, 1):
            assert f"train.py rank {rank}: its torchrun agent (pid {agent.pid}) is gone" in text, text[-3000:]
        assert not os.path.exists(os.path.join(out, "metrics.json"))
    finally:
        for pid in [agent.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
