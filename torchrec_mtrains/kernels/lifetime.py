"""What a kernel holds beyond a step (its step engine's threads, its stores), released exactly once.

A prefetch runs on the step engine's C++ threads, which call Python only through the hooks
(``hooks.py``). If the interpreter began finalizing while a hook ran or waited for the GIL,
the thread would never return from it (or be ended by ``pthread_exit``, whose forced unwinding
through C++ frames calls ``std::terminate``): the process would hang or abort instead of
exiting with its own code. So each kernel's resources are released by whichever comes first:

- ``close()``: queued prefetches run to the end, then the threads stop and the stores close;
- the kernel being collected, or the interpreter exiting (``weakref.finalize`` runs at
  ``atexit``, after non-daemon threads are joined and before finalization), however the
  process ends short of SIGKILL -- normally, ``sys.exit``, an uncaught exception,
  ``KeyboardInterrupt``, a signal handler raising ``SystemExit``: prefetches whose plan has
  not started are dropped, the running one completes, the threads are joined, and the stores
  close. Rows the cache holds dirty are not written (only ``flush``/``close`` do that): what
  was flushed stays, what was not is lost, and each store closes cleanly (the block store
  commits its location map; the SCM mapping is synced), so it reopens without repair.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import List, Optional, Sequence

import torch

from torchrec_mtrains.kernels.hooks import EngineHooks
from torchrec_mtrains.storage import RowStore
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["KernelResources"]


class KernelResources:
    """A kernel's step engine (with its hooks) and stores, with an exit hook that does not
    keep the kernel alive (it refers to these, never to the kernel)."""

    def __init__(self, owner: object, engine: torch.ScriptObject, hooks: EngineHooks, stores: List[RowStore],
                 names: Sequence[str], mover: torch.ScriptObject) -> None:
        self.engine = engine
        self._hooks = hooks  # the engine calls them until it is shut down
        self._mover = mover  # let go of the stores before they close
        # The owner's own list, not a copy: a store it swaps in later (a checkpoint's adopted
        # file) is the one closed.
        self.stores = stores
        self._names = list(names)
        self._pid = os.getpid()
        self._at_exit = weakref.finalize(owner, self._release_at_exit)

    def close(self) -> None:
        """Lets queued prefetches finish, stops the threads and closes every store (each is
        tried; the first error is raised after). The exit hook stays armed until every store
        closed, so a failed close is retried there."""
        self.engine.shutdown(False)
        self._detach_stores()
        first_error: Optional[Exception] = None
        for store in self.stores:
            try:
                store.close()
            except Exception as e:  # the next stores still close; this one is raised
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        self._at_exit.detach()

    def _release_at_exit(self) -> None:
        """The exit (or collection) path: drops unstarted prefetches, joins the threads,
        closes the stores. Reports a store that cannot close (a full disk, say) on stderr
        rather than raising, which at exit could only print a traceback. A child forked from
        the owning process leaves the stores alone: they are its parent's."""
        if os.getpid() != self._pid:
            return
        if self.engine.on_stage_thread():
            # The cycle collector ran on a prefetch thread: that thread cannot join itself,
            # and the stage it interrupted may still use the stores. Release from a thread of
            # its own (not a daemon: the interpreter waits for it at exit).
            threading.Thread(target=self._release_at_exit, name="mtrains-release").start()
            return
        if self.engine.in_flight():
            fault_point("release.in_flight")
        self.engine.shutdown(True)
        self._detach_stores()
        for store, name in zip(self.stores, self._names):
            try:
                store.close()
            except OSError as e:
                warnings.warn(f"table {name}: its store did not close at exit ({e}); rows accepted "
                              "since its last flush may be lost", RuntimeWarning, stacklevel=1)

    def _detach_stores(self) -> None:
        """The step mover lets go of every store (an SCM mapping must be gone before its
        store closes and unlocks the file); nothing moves once the engine is shut down."""
        for t in range(len(self.stores)):
            self._mover.detach(t)
