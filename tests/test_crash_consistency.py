"""Crash consistency and elastic restart of examples/dlrm/train.py (docs/reliability.md).

SIGKILLs the training process at points named by the fault hook
(torchrec_mtrains.testing.faults: mid-prefetch, mid-step, mid-flush, at every stage of a
checkpoint save) and at random times, resumes from the last complete checkpoint each time,
and checks that the run ends bit-identical to an uninterrupted one (losses, and every
tensor of the final checkpoint), that ``latest`` always names a complete checkpoint and
that a save killed half-way leaves nothing behind once the next save succeeds. Then a
2-rank torchrun job with restarts, one rank killed: it resumes by itself and ends the same.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest

from _crash_helpers import (EVERY, ROOT, STEPS, assert_same_tensors, checkpoint_tensors, env, metrics, run, torchrun_cmd,
                            torchrun_env, train_cmd)
from checkpoint import latest_checkpoint

# Each entry kills one attempt; the counts are per process (a resumed attempt counts anew).
# Tiered kernels here: one SSD kernel (2 tables), one SCM kernel (1 table): 2 prefetch jobs
# per step, 3 flushed tables per checkpoint.
FAULTS = [
    "prefetch.before:3", "forward:9", "checkpoint.write:1", "flush.table:2", "step:6",
    "checkpoint.saved:1", "prefetch.after:11", "checkpoint.latest:1", "random", "forward:2",
    "flush.table:4", "checkpoint.cleanup:1", "random", "prefetch.before:17", "step:3",
    "random", "prefetch.after:5", "checkpoint.saved:2", "flush.table:1",
    "random", "checkpoint.latest:2", "forward:14",
]
RANDOM_WINDOW_S = 2.5  # a random kill lands this long at most after training starts


def _check_latest(ckpt: str) -> None:
    """``latest`` names a complete checkpoint (DCP metadata and trainer.json of its step)."""
    if not os.path.exists(os.path.join(ckpt, "latest")):
        return
    path = latest_checkpoint(ckpt)
    assert path is not None, "latest names an incomplete checkpoint"
    assert os.path.exists(os.path.join(path, ".metadata"))
    with open(os.path.join(path, "trainer.json")) as f:
        trainer = json.load(f)
    assert os.path.basename(path) == f"step_{trainer['step']:08d}" and len(trainer["losses"]) == trainer["step"]


def _random_kill(cmd, environ, rng: random.Random) -> int:
    """Starts an attempt and SIGKILLs it at a random time once training started."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:  # printed after restore, just before the first step
        if line.startswith("placement by StorageAwarePlanner"):
            break
    time.sleep(rng.uniform(0.0, RANDOM_WINDOW_S))
    proc.send_signal(signal.SIGKILL)
    proc.stdout.close()
    return proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_kills_at_every_phase_resume_bit_identically(tmp_path) -> None:
    storage, tmp = str(tmp_path / "storage"), str(tmp_path)
    os.makedirs(tmp_path / "dcp")
    ref_ckpt, ref_out = str(tmp_path / "ref_ckpt"), str(tmp_path / "ref_out")
    proc = run(train_cmd(storage, ref_ckpt, ref_out), env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = metrics(ref_out)
    assert len(reference["losses"]) == STEPS and set(reference["placement"].values()) >= {"SSD", "SCM", "DRAM"}

    ckpt = str(tmp_path / "ckpt")
    rng = random.Random(7)
    kills, completed, log = 0, 0, []
    for i, fault in enumerate(FAULTS):
        resume = ["--resume"] if latest_checkpoint(ckpt) else []
        out = str(tmp_path / f"out{i}")
        cmd = train_cmd(storage, ckpt, out, *resume)
        if fault == "random":
            rc = _random_kill(cmd, env(), rng)
        else:
            proc = run(cmd, env(fault))
            rc = proc.returncode
            assert rc in (0, -signal.SIGKILL), f"{fault}: exit {rc}\n{proc.stderr[-3000:]}"
        latest = latest_checkpoint(ckpt)
        log.append(f"{fault}: {'killed' if rc == -signal.SIGKILL else f'exit {rc}'}, latest {latest}")
        _check_latest(ckpt)
        if rc == -signal.SIGKILL:
            kills += 1
            if fault.startswith(("checkpoint.write", "checkpoint.saved")):
                # The half-written checkpoint is on disk but is not the latest one.
                partial = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))[-1]
                assert latest is None or os.path.basename(latest) != partial, log
        else:  # the fault point was past this attempt's end: it finished, and must match
            assert rc == 0 and metrics(out)["losses"] == reference["losses"], log
            completed += 1
            os.rename(ckpt, str(tmp_path / f"done{i}"))  # start the next attempts from scratch
    assert kills >= 20, log

    final = str(tmp_path / "final")
    resume = ["--resume"] if latest_checkpoint(ckpt) else []
    proc = run(train_cmd(storage, ckpt, final, *resume), env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = metrics(final)
    assert got["losses"] == reference["losses"], log  # bit-identical, every step
    assert got["auc"] == reference["auc"]
    # Only the final checkpoint is left: killed saves were cleaned up by later ones.
    assert sorted(os.listdir(ckpt)) == ["latest", f"step_{STEPS:08d}"], log
    assert_same_tensors(checkpoint_tensors(os.path.join(ckpt, f"step_{STEPS:08d}"), str(tmp_path / "dcp")),
                        checkpoint_tensors(os.path.join(ref_ckpt, f"step_{STEPS:08d}"), str(tmp_path / "dcp")))
    print("\n".join(log + [f"{kills} kills, {completed} attempts completed"]))


def _torchrun(tmp_path, name: str, *more: str, **extra: str) -> subprocess.CompletedProcess:
    cmd = torchrun_cmd(str(tmp_path / f"{name}_storage"), str(tmp_path / f"{name}_ckpt"), str(tmp_path / f"{name}_out"),
                       *more)
    return run(cmd, torchrun_env(**extra), timeout=240)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_restarts_a_killed_rank_from_the_last_checkpoint(tmp_path) -> None:
    ref = _torchrun(tmp_path, "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    marker = tmp_path / "killed-once"
    # Rank 1 dies at its 7th step (after the checkpoint of step 4), on the first attempt only.
    proc = _torchrun(tmp_path, "elastic", MTRAINS_FAULT="step:7:1", MTRAINS_FAULT_ONCE=str(marker))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists(), "the fault never fired"
    assert "restart 1: resuming from" in proc.stderr and "step_00000004" in proc.stderr
    got, want = metrics(str(tmp_path / "elastic_out")), metrics(str(tmp_path / "ref_out"))
    assert got["resumed_from"] == EVERY and got["world_size"] == 2
    assert got["losses"] == want["losses"]
