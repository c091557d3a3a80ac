"""PrefetchPipeline's shutdown: a cancel drops the jobs whose plan has not started, completes
the running one (its move too: its plan may have packed evicted rows), and joins the threads.
Ordered by events, not by time."""

from __future__ import annotations

import threading
from typing import List

import pytest

from torchrec_mtrains.kernels.prefetch import PrefetchCancelled, PrefetchPipeline


def test_cancel_drops_unstarted_jobs_and_completes_the_running_one() -> None:
    pipeline = PrefetchPipeline(background=True)
    started, go = threading.Event(), threading.Event()
    ran: List[str] = []

    def first_plan() -> bool:
        started.set()
        go.wait()
        ran.append("plan 1")
        return True

    first = pipeline.submit(first_plan, lambda: ran.append("move 1"))
    later = [pipeline.submit(lambda n=n: ran.append(f"plan {n}"), lambda n=n: ran.append(f"move {n}"))
             for n in (2, 3)]
    started.wait()
    assert pipeline.in_flight() == 3
    pipeline.cancel()  # while job 1 plans: jobs 2 and 3 have not started
    go.set()
    pipeline.shutdown(cancel=True)
    assert ran == ["plan 1", "move 1"]
    pipeline.wait(first)
    for ticket in later:
        with pytest.raises(PrefetchCancelled):
            pipeline.wait(ticket)
    assert pipeline.in_flight() == 0


def test_shutdown_without_cancel_runs_every_queued_job() -> None:
    pipeline = PrefetchPipeline(background=True)
    ran: List[int] = []
    tickets = [pipeline.submit(lambda n=n: ran.append(n), lambda: None) for n in range(5)]
    pipeline.shutdown()
    for ticket in tickets:
        pipeline.wait(ticket)
    assert ran == list(range(5)) and pipeline.in_flight() == 0


def test_inline_pipeline_has_nothing_in_flight() -> None:
    pipeline = PrefetchPipeline(background=False)
    ticket = pipeline.submit(lambda: True, lambda: None)
    assert ticket.done and pipeline.in_flight() == 0
    pipeline.shutdown(cancel=True)
