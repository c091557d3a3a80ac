"""EngineHooks: the Python a kernel's C++ step engine calls, only where it applies.

The engine (csrc/kernel/step_engine.h) runs a step's plan and moves on its own threads with
no Python, except at two points, each a C function pointer made here with ``ctypes`` (a
ctypes callback takes the GIL itself, from any thread), and the L2-norm eviction pass of
virtual tables (``VirtualRows``, which makes its own):

- ``before_write``: while a checkpoint saves a table in the background, the old values of
  the rows a step writes back are kept first (``RowSnapshot.before_write``; the engine calls
  it only for tables with a write guard on);
- ``fault``: the crash tests' ``prefetch.before`` / ``prefetch.after`` points, installed only
  when the process's fault hook may fire or trace (``testing/faults.py``).

A hook that raises returns non-zero: the step fails and its exception waits here until the
training thread takes the step (``take_error``), which raises it.

Holds no reference to the kernel (its exit hook must let it be collected).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, List, Optional

import torch

from torchrec_mtrains.kernels.row_cache import RowCache
from torchrec_mtrains.testing.faults import fault_point, reaches

__all__ = ["EngineHooks", "PrefetchCancelled"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_BEFORE_WRITE = ctypes.CFUNCTYPE(ctypes.c_int, _PTR, _I64, _I64, _PTR, _I64)
_FAULT = ctypes.CFUNCTYPE(ctypes.c_int, _PTR, _I64, _I64)
_PHASES = ("prefetch.before", "prefetch.after")


class PrefetchCancelled(RuntimeError):
    """A queued prefetch dropped when its kernel shut down before the prefetch's plan ran."""


def _at(address: int, n: int, ctype, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over n values of C memory at ``address`` (no copy)."""
    if n == 0:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer((ctype * n).from_address(address), dtype=dtype)


class EngineHooks:
    """The hooks of one kernel's engine: ``addresses()`` for the engine's constructor.

    Args:
        cache: the kernel's tables (its virtual tables and the snapshots being saved).
    """

    def __init__(self, cache: RowCache) -> None:
        self._cache = cache
        self._errors: Dict[int, BaseException] = {}
        self._lock = threading.Lock()

        def before_write(_ctx, step, table, ids, n) -> int:
            try:
                snapshot = cache.snapshots.get(table)
                if snapshot is not None:
                    snapshot.before_write(_at(ids, n, _I64, torch.int64))
                return 0
            except BaseException as e:
                self._keep(step, e)
                return 1

        def fault(_ctx, _step, phase) -> int:
            fault_point(_PHASES[phase])
            return 0

        # Kept alive as long as this object: the engine holds only their addresses.
        self._callbacks: List[object] = [
            _BEFORE_WRITE(before_write),
            _FAULT(fault) if any(reaches(p) for p in _PHASES) else None,
        ]

    def addresses(self) -> List[int]:
        """The hooks' function addresses (0: none), as the engine takes them."""
        return [0 if c is None else ctypes.cast(c, _PTR).value or 0 for c in self._callbacks]

    def take_error(self, step: int) -> Optional[BaseException]:
        """The exception a hook raised for ``step`` (once)."""
        with self._lock:
            return self._errors.pop(step, None)

    def _keep(self, step: int, error: BaseException) -> None:
        with self._lock:
            self._errors[step] = error
