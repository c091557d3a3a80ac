"""PrefetchPipeline: runs the jobs of cache plans in two stages, each in submission order.

A job is a plan (the C++ cache index of every table, packing the rows it evicts) and a move
(tier I/O: writing the evicted rows back, loading the missing ones). Plans run on one
background thread and moves on another, so the plan of step i+2 overlaps the tier I/O of
step i+1, which overlaps the compute of step i. Both stages' heavy parts release the GIL.
A move starts only after its own plan and every earlier move, so moves reach the tier in
step order. With ``background=False`` both stages run inline in the caller.

The hand-offs are one queue operation each: the caller puts a job on the plan queue, the
plan thread puts it on the move queue, the move thread puts it on the done queue, and
``wait`` takes finished jobs off the done queue in order until its own is among them. A plan
that leaves nothing to move (every row cached) skips the move thread when no earlier job is
still there: the plan thread puts it on the done queue itself, in order all the same.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, List, Optional

__all__ = ["PrefetchCancelled", "PrefetchPipeline", "Ticket"]


class PrefetchCancelled(RuntimeError):
    """A queued prefetch dropped by ``cancel()`` (or ``shutdown(cancel=True)``) before its
    plan ran."""


class Ticket:
    """One submitted job: its stages and, once it has run, its outcome."""

    __slots__ = ("plan", "move", "error", "done", "needs_move")

    def __init__(self, plan: Callable[[], Optional[bool]], move: Callable[[], None]) -> None:
        self.plan: Optional[Callable[[], Optional[bool]]] = plan
        self.move: Optional[Callable[[], None]] = move
        self.error: Optional[BaseException] = None
        self.done = False  # set by ``wait`` in the consuming thread only
        self.needs_move = True  # False when the plan returned False (nothing to move)


class PrefetchPipeline:
    """Two stage threads (or none). ``submit`` and ``wait`` are for one consuming thread."""

    def __init__(self, background: bool) -> None:
        self.background = background
        self._failed: Optional[BaseException] = None
        self._done: "queue.SimpleQueue[Ticket]" = queue.SimpleQueue()
        self._plans: "queue.SimpleQueue[Optional[Ticket]]" = queue.SimpleQueue()
        self._moves: "queue.SimpleQueue[Optional[Ticket]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._in_move_stage = 0  # jobs handed to the move thread and not yet done
        self._unfinished = 0  # jobs submitted and not yet on the done queue
        self._cancelled = False  # set once by cancel(): plans not started are dropped
        self._order = threading.Lock()  # guards _in_move_stage and _unfinished
        self._moved = threading.Condition(self._order)  # notified when the move stage empties
        if background:
            # Daemon threads: a process that never closes its kernel still exits (the kernel's
            # exit hook, kernels/lifetime.py, stops them before the interpreter finalizes).
            self._threads = [
                threading.Thread(target=self._plan_loop, name="mtrains-plan", daemon=True),
                threading.Thread(target=self._move_loop, name="mtrains-move", daemon=True),
            ]
            for thread in self._threads:
                thread.start()

    def submit(self, plan: Callable[[], Optional[bool]], move: Callable[[], None]) -> Ticket:
        """Queues ``plan`` then ``move`` (or runs both now, inline). A plan returning False
        has nothing for ``move`` to do, which then does not run. A failed plan's move does
        not run; once a stage failed, every later job fails too."""
        ticket = Ticket(plan, move)
        if self._threads:
            with self._order:
                self._unfinished += 1
            self._plans.put(ticket)
        else:
            self._run(ticket, "plan")
            if ticket.needs_move:
                self._run(ticket, "move")
            ticket.done = True
        return ticket

    def wait(self, ticket: Ticket) -> None:
        """Returns once ``ticket``'s job has run; raises its exception if a stage failed."""
        while not ticket.done:
            self._done.get().done = True  # jobs finish in submission order
        if ticket.error is not None:
            raise ticket.error

    def wait_for_moves(self) -> None:
        """Returns once no job is in the move stage. Called by a plan (on the plan thread),
        that is once every earlier job has moved: only the plan thread hands jobs to the move
        stage, so none starts moving until the plan returns. Inline, there is nothing to wait
        for. An eviction pass reads rows that earlier moves write back (kernels/row_weights.py)."""
        with self._moved:
            self._moved.wait_for(lambda: self._in_move_stage == 0)

    def on_stage_thread(self) -> bool:
        """Whether the calling thread is one of this pipeline's stage threads."""
        return threading.current_thread() in self._threads

    def in_flight(self) -> int:
        """Jobs submitted whose stages have not all run (0 without background threads)."""
        with self._order:
            return self._unfinished

    def cancel(self) -> None:
        """From now on, drops each job when its plan would start (its ticket then fails with
        ``PrefetchCancelled``); a job already planned still moves. Not undone."""
        self._cancelled = True

    def shutdown(self, cancel: bool = False) -> None:
        """Stops the threads once queued jobs are done. Idempotent.

        Args:
            cancel: drop the jobs whose plan has not started instead of running them (the
                running stage always completes: a C++ call cannot be interrupted).
        """
        if cancel:
            self.cancel()
        if self._threads:
            self._plans.put(None)
            for thread in self._threads:
                thread.join()
        self._threads = []

    def _run(self, ticket: Ticket, stage: str) -> None:
        """Runs one stage of ``ticket`` unless it (or an earlier job) already failed."""
        if stage == "plan":
            work, ticket.plan = ticket.plan, None
        else:
            work, ticket.move = ticket.move, None
        if ticket.error is not None:
            return
        if self._cancelled and stage == "plan":
            ticket.error = PrefetchCancelled("the prefetch was dropped: its kernel shut down before it ran")
            return
        if self._failed is not None:
            ticket.error = RuntimeError(
                f"an earlier prefetch failed ({type(self._failed).__name__}: {self._failed})")
            return
        try:
            if work() is False:
                # Nothing to move: drop the move now. Its closure refers to the job, which
                # refers to this ticket: kept, the cycle would live until the collector ran.
                ticket.needs_move, ticket.move = False, None
        except BaseException as e:  # re-raised by wait() in the consuming thread
            self._failed = ticket.error = e

    def _plan_loop(self) -> None:
        while (ticket := self._plans.get()) is not None:
            self._run(ticket, "plan")
            with self._order:
                skip = not ticket.needs_move and self._in_move_stage == 0
                if skip:
                    self._unfinished -= 1
                else:
                    self._in_move_stage += 1
            (self._done if skip else self._moves).put(ticket)
        self._moves.put(None)

    def _move_loop(self) -> None:
        while (ticket := self._moves.get()) is not None:
            if ticket.needs_move:
                self._run(ticket, "move")
            else:
                ticket.move = None
            self._done.put(ticket)  # before the count drops: a skipping plan must queue after it
            with self._order:
                self._in_move_stage -= 1
                self._unfinished -= 1
                if self._in_move_stage == 0:
                    self._moved.notify_all()
