"""A process that ends with prefetches in flight exits with Python's own code, and its stores
reopen holding every flushed row (kernels/lifetime.py).

Each case runs tests/support/clean_exit_worker.py in a subprocess: it trains an SSD or SCM table,
flushes, queues prefetches that read from the device, and ends -- normally without close(),
by sys.exit, an uncaught exception, SIGINT, or SIGTERM with a handler raising SystemExit.
Before the exit hook it would abort: C++ running on the prefetch threads while the
interpreter finalized ended in std::terminate (SIGABRT, exit 134).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import warnings
from pathlib import Path

import pytest
import torch

from tests.support.clean_exit_worker import EXIT_CODE, SIGTERM_CODE, WORKER
from tests.support.crash_helpers import fault_trace, run
from torchrec_mtrains.storage import BlockStore, ScmStore

HANG_GUARD_S = 300  # only against a hang: a case takes a few seconds
EXPECTED_CODE = {
    "normal": 0,
    "exit": EXIT_CODE,
    "raise": 1,
    "sigint": -signal.SIGINT,  # Python ends an uncaught KeyboardInterrupt by SIGINT (a shell's 130)
    "sigterm": SIGTERM_CODE,
}
OPENERS = {"SSD": BlockStore.open, "SCM": ScmStore.open}


def _sha256_of_store(tier: str, path: str) -> str:
    """The sha256 of every row of the store at ``path``, reopened with warnings as errors (a
    store needing repair would say so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = OPENERS[tier](path)
    try:
        rows = store.read(torch.arange(store.num_rows))
    finally:
        store.close()
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()


_WINDOW_CASES = [("SSD", "normal", 4), ("SSD", "sigterm", 4), ("SCM", "exit", 2)]


@pytest.mark.parametrize("tier, end, lookahead",
                         [(t, e, 0) for t in ("SSD", "SCM") for e in EXPECTED_CODE] + _WINDOW_CASES,
                         ids=lambda v: str(v))
def test_ending_with_prefetches_in_flight_exits_cleanly(tmp_path: Path, tier: str, end: str, lookahead: int) -> None:
    """With a look-ahead window, the last prefetches' plans are still held back at the end."""
    report, trace = tmp_path / "report.json", tmp_path / "fault.trace"
    env = dict(os.environ, MTRAINS_FAULT_TRACE=str(trace), OMP_NUM_THREADS="1")
    env.pop("MTRAINS_FAULT", None)
    proc = run([*WORKER, tier, str(tmp_path / "storage"), end, str(report), str(lookahead)], env,
               timeout=HANG_GUARD_S)
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == EXPECTED_CODE[end], proc.stderr[-3000:]
    # The exit hook found prefetches still queued or running: the case tested what it claims.
    assert ("release.in_flight", "1") in fault_trace(str(trace)), "the prefetches had finished before exit"
    with open(report) as f:
        flushed = json.load(f)
    assert _sha256_of_store(tier, flushed["store"]) == flushed["sha256"]


@pytest.mark.parametrize("tier", ["SSD", "SCM"])
def test_a_forked_child_that_exits_leaves_the_parents_stores_alone(tmp_path: Path, tier: str) -> None:
    """The exit hook runs in a child forked with a live kernel too; it must not close (unlock,
    commit) the stores, which are the parent's."""
    report = tmp_path / "report.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MTRAINS_FAULT", None)
    proc = run([*WORKER, tier, str(tmp_path / "storage"), "fork", str(report)], env,
               timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-3000:]
    with open(report) as f:
        result = json.load(f)
    assert result["child_exit"] == 0 and result["untouched"] and result["still_locked"], result
    assert _sha256_of_store(tier, result["store"]) == result["sha256"]
