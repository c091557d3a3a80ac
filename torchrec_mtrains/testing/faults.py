"""Crash-test fault hook: SIGKILL this process when a named point is reached.

Set in the environment of the process to kill (read once, at import)::

    MTRAINS_FAULT="<phase>:<n>[:<rank>]"   kill at the n-th time (1-based) <phase> is reached
                                           in this process; with <rank>, only on that rank
                                           (env RANK, 0 when unset)
    MTRAINS_FAULT_ONCE=<path>              fire only if <path> does not exist, and create it
                                           just before the kill (a job restarted by torchrun
                                           with the same environment then runs clean)

The kill is ``SIGKILL`` of the whole process (no handlers, no flushing, no atexit), the way
the OOM killer or a lost node ends a job. Phases (``PHASES``) and where they are:

- ``prefetch.before`` / ``prefetch.after``: a TieredEmbeddingBags cache plan (on the
  prefetch thread), before it moves any row / after its evictions and loads;
- ``forward``: TieredEmbeddingBags.forward with the step's rows in place, before the TBE
  computes (mid-step: the previous step's optimizer has run, this one's not);
- ``flush.table``: TieredEmbeddingBags.flush, after each table's rows are written and its
  store synced, before the next table;
- ``checkpoint.flush`` .. ``checkpoint.cleanup``: examples/dlrm/checkpoint.py, see there.
- ``step``: examples/dlrm/train.py, after a step's loss is known, before its checkpoint.

Unset, ``fault_point`` is one test of a module global: no cost on the data path.
"""

from __future__ import annotations

import os
import signal
from typing import Dict, Optional, Tuple

__all__ = ["PHASES", "fault_point"]

PHASES = (
    "prefetch.before", "prefetch.after", "forward", "flush.table",
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


_SPEC = _parse(os.environ.get("MTRAINS_FAULT"))
_ONCE = os.environ.get("MTRAINS_FAULT_ONCE")
_seen: Dict[str, int] = {}


def fault_point(phase: str) -> None:
    """Marks a point where a crash test may kill the process (see the module doc)."""
    if _SPEC is None or phase != _SPEC[0]:
        return
    _seen[phase] = n = _seen.get(phase, 0) + 1
    if n != _SPEC[1] or (_SPEC[2] is not None and int(os.environ.get("RANK", "0")) != _SPEC[2]):
        return
    if _ONCE:
        if os.path.exists(_ONCE):
            return
        with open(_ONCE, "w") as f:
            f.write(f"{phase}:{n} pid {os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)
