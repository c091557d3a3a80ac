"""PrefetchPipeline: runs the jobs of cache plans in two stages, each in submission order.

A job is a plan (the C++ cache index, packing the rows it evicts) and a move (tier I/O:
writing the evicted rows back, loading the missing ones into their slots). Plans run on
one background worker and moves on another, so the plan of step i+2 overlaps the tier
I/O of step i+1, which overlaps the compute of step i. Both stages' heavy parts release
the GIL. A move starts only after its own plan and every earlier move, so moves reach the
tier in step order. With ``background=False`` both stages run inline in the caller.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable, Optional

__all__ = ["PrefetchPipeline"]


class PrefetchPipeline:
    def __init__(self, background: bool) -> None:
        self.background = background
        self._plans: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._moves: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._failed: Optional[BaseException] = None
        if background:
            self._plans = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mtrains-plan")
            self._moves = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mtrains-move")

    def submit(self, plan: Callable[[], None], move: Callable[[], None]) -> "concurrent.futures.Future[None]":
        """Queues ``plan`` then ``move`` (or runs both now, inline). The future completes
        when the move has; an exception of either surfaces in its ``result()`` (a failed
        plan's move does not run)."""
        if self._plans is not None and self._moves is not None:
            planned = self._plans.submit(self._guarded, plan)
            return self._moves.submit(self._after, planned, move)
        future: "concurrent.futures.Future[None]" = concurrent.futures.Future()
        try:
            self._guarded(plan)
            self._guarded(move)
            future.set_result(None)
        except BaseException as e:  # re-raised by future.result() in the caller
            future.set_exception(e)
        return future

    def shutdown(self) -> None:
        for executor in (self._plans, self._moves):
            if executor is not None:
                executor.shutdown(wait=True)
        self._plans = self._moves = None

    def _guarded(self, stage: Callable[[], None]) -> None:
        if self._failed is not None:
            raise RuntimeError(f"an earlier prefetch failed ({type(self._failed).__name__}: {self._failed})")
        try:
            stage()
        except BaseException as e:
            self._failed = e
            raise

    def _after(self, planned: "concurrent.futures.Future[None]", move: Callable[[], None]) -> None:
        planned.result()  # raises the plan's exception
        self._guarded(move)
