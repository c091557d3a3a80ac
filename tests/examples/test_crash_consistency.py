"""Crash consistency and elastic restart of examples/dlrm/train.py (docs/reliability.md).

SIGKILLs the training process at points named by the fault hook
(torchrec_mtrains.testing.faults: mid-prefetch, mid-step, mid-flush, at every stage of a
checkpoint save), at chosen counts and at counts drawn from a seeded RNG, resumes from the
last complete checkpoint each time, and checks that every attempt died where it was aimed,
that the run ends bit-identical to an uninterrupted one (losses, and every tensor of the
final checkpoint), that ``latest`` always names a complete checkpoint and that a save killed
half-way leaves nothing behind once the next save succeeds. Then a 2-rank torchrun job with
restarts, one rank killed: it resumes by itself and ends the same.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from typing import Dict, List, Tuple

import pytest

from tests.support.crash_helpers import (EVERY, STEPS, assert_same_tensors, checkpoint_tensors, env, fault_trace,
                                         metrics, run, torchrun_cmd, torchrun_env, train_cmd)
from tests.support.paths import add_example_to_path
from torchrec_mtrains.checkpoint import export_full_checkpoint
from torchrec_mtrains.testing import PHASES

add_example_to_path()
from checkpoint import latest_checkpoint  # noqa: E402

# Each entry kills one attempt at the n-th time (counted in that process) it reaches a
# phase; "random" draws the phase and the count from a seeded RNG among those the attempt
# reaches. Tiered kernels here: one SSD kernel (2 tables), one SCM kernel (1 table): 2
# prefetch jobs and 2 forwards per step, 3 flush.table points per checkpoint (TorchRec flushes
# again before its state_dict; that flush finds nothing to write).
FAULTS = [
    "prefetch.before:3", "checkpoint.write:1", "flush.table:2", "forward:9", "checkpoint.latest:1",
    "prefetch.after:5", "random",
]


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


def _reached(trace: List[Tuple[str, ...]], resume_step: int) -> Dict[str, int]:
    """Per phase, how many times an attempt resuming at ``resume_step`` (0: from scratch)
    reaches it at least: an uninterrupted run's hits after its step ``resume_step + 1``
    (later steps, their checkpoints, the evaluation), which the attempt makes too; a step of
    slack because the prefetch thread's hits of the next batch may fall on either side."""
    counts = dict.fromkeys(PHASES, 0)
    steps = 0
    for phase, *_ in trace:
        if steps > resume_step:  # past the run's step resume_step + 1
            counts[phase] += 1
        steps += phase == "step"
    return counts


def _resume_step(ckpt: str) -> int:
    latest = latest_checkpoint(ckpt)
    if latest is None:
        return 0
    with open(os.path.join(latest, "trainer.json")) as f:
        return json.load(f)["step"]


def _aim(fault: str, reached: Dict[str, int], rng: random.Random) -> Tuple[str, int]:
    """(phase, count) to aim an attempt at for a FAULTS entry; count 0 when the entry's
    count is past what the attempt reaches (for "random": when it reaches no phase)."""
    if fault != "random":
        phase, count = fault.split(":")
        return phase, int(count) if int(count) <= reached[phase] else 0
    candidates = [p for p in PHASES if reached[p] > 0]
    if not candidates:
        return "random", 0
    phase = rng.choice(candidates)
    return phase, rng.randint(1, reached[phase])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_kills_at_every_phase_resume_bit_identically(tmp_path) -> None:
    storage = str(tmp_path / "storage")
    os.makedirs(tmp_path / "dcp")
    ref_ckpt, ref_out, ref_trace = str(tmp_path / "ref_ckpt"), str(tmp_path / "ref_out"), str(tmp_path / "ref.trace")
    proc = run(train_cmd(storage, ref_ckpt, ref_out), env(MTRAINS_FAULT_TRACE=ref_trace))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = metrics(ref_out)
    assert len(reference["losses"]) == STEPS and set(reference["placement"].values()) >= {"SSD", "SCM", "DRAM"}
    ref_hits = fault_trace(ref_trace)

    ckpt = str(tmp_path / "ckpt")
    rng = random.Random(7)
    log: List[str] = []
    for i, fault in enumerate(FAULTS):
        start = _resume_step(ckpt)
        how = "resumed" if start else "fresh"
        phase, count = _aim(fault, _reached(ref_hits, start), rng)
        if count == 0:  # past what an attempt from this checkpoint reaches: start over
            os.rename(ckpt, str(tmp_path / f"set_aside{i}"))
            start, how = 0, "started over"
            phase, count = _aim(fault, _reached(ref_hits, start), rng)
            assert count > 0, f"{fault}: an uninterrupted run never gets there"
        resume = ["--resume"] if start else []
        trace = str(tmp_path / f"try{i}.trace")
        proc = run(train_cmd(storage, ckpt, str(tmp_path / f"out{i}"), *resume),
                   env(f"{phase}:{count}", MTRAINS_FAULT_TRACE=trace))
        what = f"try {i} ({fault}): {phase}:{count}, {how} from step {start}"
        assert proc.returncode == -signal.SIGKILL, f"{what}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        died_at = fault_trace(trace)[-1]
        assert died_at == (phase, str(count), "SIGKILL"), f"{what}: the last point reached was {died_at}"
        latest = latest_checkpoint(ckpt)
        log.append(f"{what}: killed there, latest {latest and os.path.basename(latest)}")
        _check_latest(ckpt)
        if phase in ("checkpoint.write", "checkpoint.saved"):
            # The half-written checkpoint is on disk but is not the latest one.
            partial = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))[-1]
            assert latest is None or os.path.basename(latest) != partial, log

    final = str(tmp_path / "final")
    resume = ["--resume"] if latest_checkpoint(ckpt) else []
    proc = run(train_cmd(storage, ckpt, final, *resume), env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = metrics(final)
    assert got["losses"] == reference["losses"], log  # bit-identical, every step
    assert got["auc"] == reference["auc"]
    # Only the final checkpoint's chain is left: killed saves were cleaned up by later starts,
    # older chains once a newer one was complete.
    with open(os.path.join(ckpt, f"step_{STEPS:08d}", "trainer.json")) as f:
        base = json.load(f)["base"]
    assert sorted(os.listdir(ckpt)) == ["latest"] + [f"step_{s:08d}" for s in range(base, STEPS + 1, EVERY)], log
    # Both chains restore to the same tensors (exported whole: their deltas differ in
    # where their full steps fall).
    for name, chain in (("got", ckpt), ("ref", ref_ckpt)):
        export_full_checkpoint(os.path.join(chain, f"step_{STEPS:08d}"), str(tmp_path / f"export_{name}"))
    assert_same_tensors(checkpoint_tensors(str(tmp_path / "export_got"), str(tmp_path / "dcp")),
                        checkpoint_tensors(str(tmp_path / "export_ref"), str(tmp_path / "dcp")))
    print("\n".join(log + [f"{len(FAULTS)} attempts, each killed where it was aimed"]))


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
