"""Crash-test fault hook: SIGKILL this process when a named point is reached.

Set in the environment of the process to kill (read once, at import)::

    MTRAINS_FAULT="<phase>:<n>[:<rank>]"   kill at the n-th time (1-based) <phase> is reached
                                           in this process; with <rank>, only on that rank
                                           (env RANK, 0 when unset)
    MTRAINS_FAULT_ONCE=<path>              fire only if <path> does not exist, and create it
                                           just before the kill (a job restarted by torchrun
                                           with the same environment then runs clean)
    MTRAINS_FAULT_TRACE=<path>             append a line "<phase> <n>" to <path> each time a
                                           point is reached (n: its count in this process),
                                           "<phase> <n> <signal>" for the one that fires; so a
                                           test learns how often each point is reached, and
                                           where a killed process died
    MTRAINS_FAULT_SIGNAL=SIGSTOP           stop the process there instead of killing it: a
                                           test then acts at that very point (fills a disk,
                                           say) and resumes it with SIGCONT

The kill is ``SIGKILL`` of the whole process (no handlers, no flushing, no atexit), the way
the OOM killer or a lost node ends a job. Phases (``PHASES``) and where they are:

- ``prefetch.before`` / ``prefetch.after``: a TieredEmbeddingBags cache plan (on the step
  engine's plan thread, through its fault hook), before it moves any row / once its
  evictions and loads are planned, before they move;
- ``forward``: TieredEmbeddingBags.forward with the step's rows in place, before the TBE
  computes (mid-step: the previous step's optimizer has run, this one's not);
- ``flush.table``: TieredEmbeddingBags.flush, after each table's rows are written and its
  store synced, before the next table;
- ``release.in_flight``: a TieredEmbeddingBags released at exit (or collected) unclosed,
  with prefetches still queued or running, before they are dropped or joined;
- ``checkpoint.flush``: DifferentialCheckpointer.save, every tier flushed, nothing written;
- ``checkpoint.write``: this rank's data files of the step written, no ``.metadata`` yet
  (checkpoint/row_io.py);
- ``checkpoint.saved``: the DCP save and the manifests complete, no ``trainer.json``;
- ``checkpoint.latest``: ``trainer.json`` written, ``latest`` not yet switched;
- ``checkpoint.cleanup``: ``latest`` switched, older chains not yet removed;
- ``step``: examples/dlrm/train.py, after a step's loss is known, before its checkpoint.

Every phase is reached by some workload (tests/core/test_fault_points.py checks it); a name that
is not a phase is refused when the hook reads the environment.

With MTRAINS_FAULT and MTRAINS_FAULT_TRACE unset, ``fault_point`` is one test of a module
global: no cost on the data path.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Optional, TextIO, Tuple

__all__ = ["PHASES", "fault_point", "reaches"]

PHASES = (
    "prefetch.before", "prefetch.after", "forward", "flush.table", "release.in_flight",
    "checkpoint.flush", "checkpoint.write", "checkpoint.saved", "checkpoint.latest", "checkpoint.cleanup",
    "step",
)


def _parse(spec: Optional[str]) -> Optional[Tuple[str, int, Optional[int]]]:
    if not spec:
        return None
    parts = spec.split(":")
    try:
        if len(parts) not in (2, 3) or parts[0] not in PHASES:
            raise ValueError
        count = int(parts[1])
        rank = int(parts[2]) if len(parts) == 3 else None
        if count < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"MTRAINS_FAULT={spec!r} must be '<phase>:<n>[:<rank>]' with n >= 1 and phase one of "
                         f"{', '.join(PHASES)}") from None
    return parts[0], count, rank


def _open_trace(path: Optional[str]) -> Optional[TextIO]:
    if not path:
        return None
    try:
        return open(path, "a", buffering=1)  # line-buffered: every line is out before a kill
    except OSError as e:
        raise OSError(e.errno, f"MTRAINS_FAULT_TRACE={path!r}: {e.strerror}") from None


def _signal(name: Optional[str]) -> signal.Signals:
    signals = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}
    if name and name not in signals:
        raise ValueError(f"MTRAINS_FAULT_SIGNAL={name!r} must be one of {', '.join(signals)}")
    return signals[name or "SIGKILL"]


_SPEC = _parse(os.environ.get("MTRAINS_FAULT"))
_SIGNAL = _signal(os.environ.get("MTRAINS_FAULT_SIGNAL"))
_ONCE = os.environ.get("MTRAINS_FAULT_ONCE")
_TRACE = _open_trace(os.environ.get("MTRAINS_FAULT_TRACE"))
_seen: Dict[str, int] = {}
_lock = threading.Lock()  # points are reached on the prefetch thread too


def fault_point(phase: str) -> None:
    """Marks a point where a crash test may kill the process (see the module doc)."""
    if _TRACE is None and (_SPEC is None or phase != _SPEC[0]):
        return
    # Held through the kill: no other thread's line can follow the killing one in the trace.
    with _lock:
        _seen[phase] = n = _seen.get(phase, 0) + 1
        fire = _fires(phase, n)
        if _TRACE is not None:
            _TRACE.write(f"{phase} {n} {_SIGNAL.name}\n" if fire else f"{phase} {n}\n")
        if fire:
            os.kill(os.getpid(), _SIGNAL)


def reaches(phase: str) -> bool:
    """Whether reaching ``phase`` may do anything in this process (fire or be traced): a
    point on a path that must not call Python needlessly is installed only then."""
    return _TRACE is not None or (_SPEC is not None and phase == _SPEC[0])


def _fires(phase: str, n: int) -> bool:
    """Whether the n-th time ``phase`` is reached fires (creating the ONCE file)."""
    if _SPEC is None or (phase, n) != _SPEC[:2]:
        return False
    if _SPEC[2] is not None and int(os.environ.get("RANK", "0")) != _SPEC[2]:
        return False
    if _ONCE:
        if os.path.exists(_ONCE):
            return False
        with open(_ONCE, "w") as f:
            f.write(f"{phase}:{n} pid {os.getpid()}\n")
    return True
