"""Every fault point the hook lists (torchrec_mtrains.testing.PHASES) is reached by a traced
workload, so ``MTRAINS_FAULT=<phase>:<n>`` can fire for each; a name that is not a phase is
refused with a message listing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.clean_exit_worker import WORKER
from tests.support.crash_helpers import env, fault_trace, run, train_cmd
from torchrec_mtrains.testing import PHASES

HANG_GUARD_S = 600  # only against a hang: the workloads take seconds


@pytest.mark.slow
def test_every_phase_is_reached_by_a_traced_workload(tmp_path: Path) -> None:
    # The example with checkpoints (steps, prefetches, forwards, flushes, every save stage) ...
    train_trace = str(tmp_path / "train.trace")
    proc = run(train_cmd(str(tmp_path / "storage"), str(tmp_path / "ckpt"), str(tmp_path / "out")),
               env(MTRAINS_FAULT_TRACE=train_trace), timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # ... and a process that ends with prefetches in flight (the kernel's exit hook).
    exit_trace = str(tmp_path / "exit.trace")
    proc = run([*WORKER, "SSD", str(tmp_path / "exit_storage"), "normal", str(tmp_path / "r.json")],
               env(MTRAINS_FAULT_TRACE=exit_trace), timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reached = {line[0] for line in fault_trace(train_trace) + fault_trace(exit_trace)}
    assert reached == set(PHASES), f"never reached: {sorted(set(PHASES) - reached)}"


def test_an_unknown_phase_is_refused() -> None:
    proc = subprocess.run([sys.executable, "-c", "import torchrec_mtrains.testing"], capture_output=True, text=True,
                          env=env(fault="checkpoint.flushed:1"), timeout=HANG_GUARD_S)
    assert proc.returncode != 0
    assert "MTRAINS_FAULT='checkpoint.flushed:1' must be" in proc.stderr and "release.in_flight" in proc.stderr
