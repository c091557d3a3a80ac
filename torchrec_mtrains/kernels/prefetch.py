"""PrefetchPipeline: runs cache plans on one background worker, in submission order.

The heavy parts of a plan (the C++ cache index, block-store I/O, tensor gathers and
scatters) release the GIL, so the worker overlaps the tier I/O of step i+1 with the
compute of step i. With ``background=False`` the same jobs run inline in the caller.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Optional

__all__ = ["PrefetchPipeline"]


class PrefetchPipeline:
    def __init__(self, background: bool) -> None:
        self.background = background
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mtrains-prefetch")
            if background
            else None
        )

    def submit(self, job: Callable[[], None]) -> "concurrent.futures.Future[None]":
        """Queues ``job`` (or runs it now, inline); its exception surfaces in ``result()``."""
        if self._executor is not None:
            return self._executor.submit(job)
        future: "concurrent.futures.Future[None]" = concurrent.futures.Future()
        try:
            job()
            future.set_result(None)
        except BaseException as e:  # re-raised by future.result() in the caller
            future.set_exception(e)
        return future

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
