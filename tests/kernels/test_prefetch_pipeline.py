"""PrefetchPipeline's shutdown: a cancel drops the jobs whose plan has not started, completes
the running one (its move too: its plan may have packed evicted rows), and joins the threads.
Ordered by events, not by time."""

from __future__ import annotations

import threading
from typing import List

import pytest
import torch

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


def test_exit_hook_run_on_a_stage_thread_releases_from_its_own(tmp_path) -> None:
    """The cycle collector may run a kernel's exit hook on a prefetch thread, which cannot
    join itself: the release then runs on a thread of its own, joins the stage threads and
    closes the stores."""
    from torchrec_mtrains.kernels.lifetime import KernelResources
    from torchrec_mtrains.storage import BlockStore

    class Owner:
        pass

    pipeline = PrefetchPipeline(background=True)
    store = BlockStore(tmp_path / "t.blk", 16, 4)
    owner = Owner()  # alive: the hook runs only when called below
    mover = torch.classes.mtrains.StepMover(1)
    store.attach_to(mover, 0)
    resources = KernelResources(owner, pipeline, [store], ["t"], mover)
    stage_threads = list(pipeline._threads)

    def plan_that_collects() -> bool:
        resources._at_exit()  # what a collection of the owner on this thread runs
        return False

    pipeline.wait(pipeline.submit(plan_that_collects, lambda: None))
    for thread in threading.enumerate():
        if thread.name == "mtrains-release":
            thread.join()
    assert store.closed
    assert not any(t.is_alive() for t in stage_threads)


@pytest.mark.parametrize("background", [True, False])
def test_a_job_with_nothing_to_move_drops_its_move(background: bool) -> None:
    """A plan that finds nothing to move (every row cached) never runs its move; the move is
    dropped at once, so a job that refers to its own ticket (as the kernel's steps do) is
    freed by reference counting, not left in a cycle for the collector."""
    import gc
    import weakref

    class Job:
        ticket = None

    pipeline = PrefetchPipeline(background=background)
    moved: List[int] = []
    job = Job()
    job.ticket = pipeline.submit(lambda: False, lambda: moved.append(id(job)))
    pipeline.wait(job.ticket)
    assert moved == [] and job.ticket.move is None and job.ticket.plan is None
    alive = weakref.ref(job)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del job
        assert alive() is None
    finally:
        if enabled:
            gc.enable()
    pipeline.shutdown()
