"""The look-ahead window (``lookahead=k``): the plan of a batch waits for the k batches
after it and evicts none of their rows. It changes which rows stay cached, never a result.

Against FBGEMM's CPU TBE with the whole table in DRAM (tests/support/tiered_helpers.py's
reference): every tier, stage threads and inline, windows of 1 and 3 with the batches
prefetched k + 1 ahead, with fewer prefetched than the window (forward then plans its batch
anyway), mixed schedules, cancel_prefetch with the window's batches pending, and a
checkpoint's flush and rows read with them pending. The window's guarantee itself (no row
a window batch uses is evicted) is checked in C++ (csrc/tests/test_set_associative_cache.cc,
test_step_engine.cc); here, that the cache misses fewer rows with it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.support.tiered_helpers import (
    Model,
    Workload,
    assert_tables_match,
    drive,
    make_kernel,
    make_steps,
    output_checker,
    reference_run,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
)
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags

TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]


@pytest.mark.parametrize("pipeline", [True, False], ids=["threads", "inline"])
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
@pytest.mark.parametrize("window, schedule", [(1, "ahead2"), (3, "ahead4"), (3, "ahead"), (2, "inline")],
                         ids=["k1-ahead2", "k3-ahead4", "k3-ahead1", "k2-no-prefetch"])
def test_window_trains_as_fbgemm(tmp_path: Path, tier: Tier, pipeline: bool, window: int, schedule: str) -> None:
    model, workload = Model(), Workload(steps=80, data_seed=41)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=16, cache_ways=4, cache_algorithm="lfu",
                      prefetch_pipeline=pipeline, lookahead=window)
    try:
        assert all(t["lookahead"] == window for t in ker.cache_stats().values())
        drive(ker, steps, schedule, output_checker(traj, model))
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


def _misses(tmp_path: Path, window: int, steps, model: Model) -> int:
    ker = make_kernel(model, Tier.DRAM, tmp_path / f"k{window}", cache_rows=48, cache_ways=8,
                      cache_algorithm="lru", lookahead=window)
    try:
        drive(ker, steps, "ahead4", lambda s, out: None)
        return sum(t["misses"] for t in ker.cache_stats().values())
    finally:
        ker.close()


def test_window_misses_fewer_rows(tmp_path: Path) -> None:
    """The same batches, four prefetched ahead: a window of 3 misses fewer rows than none."""
    model = Model()
    steps = make_steps(model.specs, Workload(steps=120, data_seed=42, batch_size=32))
    assert _misses(tmp_path, 3, steps, model) < _misses(tmp_path, 0, steps, model)


@pytest.mark.parametrize("pipeline", [True, False], ids=["threads", "inline"])
def test_mixed_schedule_and_cancel_with_window_pending(tmp_path: Path, pipeline: bool) -> None:
    """Zero to four batches prefetched ahead at random (fewer than the window, or none), and
    twice the wrong batches prefetched and cancelled while the window holds them."""
    model, workload = Model(), Workload(steps=90, data_seed=43)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    check = output_checker(traj, model)
    rnd = random.Random(7)
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=24, cache_ways=4, prefetch_pipeline=pipeline,
                      lookahead=2)
    prefetched = 0
    try:
        for s, step in enumerate(steps):
            if s in (20, 55):
                for wrong in steps[s + 5:s + 8]:
                    ker.prefetch(wrong.indices, wrong.offsets)
                # Pending: the batches prefetched for the coming steps, then the three wrong ones.
                pending = ker.pending_prefetches
                assert ker.cancel_prefetch() == pending
                prefetched = s
            prefetched = max(prefetched, s)
            for _ in range(rnd.randint(0, 3)):
                if prefetched < min(len(steps), s + 4):
                    ker.prefetch(steps[prefetched].indices, steps[prefetched].offsets)
                    prefetched += 1
            out = ker(step.indices, step.offsets)
            check(s, out.detach())
            out.backward(step.grad)
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


def test_flush_and_reads_with_window_pending(tmp_path: Path) -> None:
    """A checkpoint's flush and whole-table reads while three batches wait in the window:
    the rows read are the trained ones, and training goes on as the reference's."""
    model, workload = Model(), Workload(steps=60, data_seed=44)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    check = output_checker(traj, model)
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=16, cache_ways=4, lookahead=3)
    try:
        for s in range(3):
            ker.prefetch(steps[s].indices, steps[s].offsets)
        for s, step in enumerate(steps):
            if s + 3 < len(steps):
                ker.prefetch(steps[s + 3].indices, steps[s + 3].offsets)
            if s in (10, 30):
                assert ker.pending_prefetches == 4
                ker.flush()
                before = [ker.read_rows(t, 0, rows)[0].clone() for t, (rows, _) in enumerate(model.specs)]
                again = [ker.read_rows(t, 0, rows)[0] for t, (rows, _) in enumerate(model.specs)]
                assert all(torch.equal(a, b) for a, b in zip(before, again))
            out = ker(step.indices, step.offsets)
            check(s, out.detach())
            out.backward(step.grad)
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


def test_lookahead_setting_is_checked(tmp_path: Path) -> None:
    for bad in (-1, 1.5, True, 10_000):
        with pytest.raises(ValueError, match="lookahead"):
            TieredEmbeddingBags([(100, 4)], tier=Tier.DRAM, storage_dir=str(tmp_path), lookahead=bad)
