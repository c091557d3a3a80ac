"""Tiered tables in DistributedModelParallel, in spawned gloo processes (world sizes 1, 2).

Every run starts from the same weights and trains on the same global batches through the
TieredTrainPipeline; tiered runs must match all-FUSED runs, and a run killed after a DCP
checkpoint must resume (also into world size 1 and onto other tiers) as if uninterrupted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest
import torch

from tests.support import dmp_harness as harness

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

TOL = 1e-4  # max abs diff allowed against all-FUSED training
TIERED = {"ssd_a": "ssd", "ssd_b": "ssd", "scm_c": "scm", "plain_d": None}
ALL_FUSED = {t: None for t in harness.TABLES}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dmp")
    torch.save(harness.initial_weights(), d / "init.pt")
    return d


@pytest.fixture(scope="module")
def runs(workdir: Path):
    """Runs each spec once per module (several tests compare against the same run)."""
    done: Dict[str, str] = {}

    def get(name: str, **kwargs) -> str:
        if name not in done:
            out = workdir / name
            out.mkdir()
            spec = harness.RunSpec(out_dir=str(out), storage_dir=str(workdir / f"storage_{name}"), **kwargs)
            codes = harness.launch(spec)
            expect = [-9] * spec.world_size if spec.kill_after_save else [0] * spec.world_size
            assert codes == expect, f"run {name}: exit codes {codes}"
            done[name] = str(out)
        return done[name]

    get.init = str(workdir / "init.pt")  # type: ignore[attr-defined]
    return get


def _compare(a: str, b: str, first_step_of_b: int = 0) -> None:
    la, lb = harness.read_losses(a), harness.read_losses(b)
    assert len(lb) == len(la) - first_step_of_b
    assert max(abs(x - y) for x, y in zip(la[first_step_of_b:], lb)) <= TOL
    fa, fb = harness.read_final(a), harness.read_final(b)
    assert set(fa) == set(fb)
    assert any(".momentum1" in k for k in fa)  # optimizer state is compared too
    for key in fa:
        assert fa[key].shape == fb[key].shape, key
        assert (fa[key] - fb[key]).abs().max().item() <= TOL, key


@pytest.mark.parametrize(
    "world_size,sharding_type",
    [(1, "table_wise"), (2, "table_wise"), (2, "row_wise"), (2, "column_wise")],
)
def test_tiered_tables_train_like_fused(runs, world_size: int, sharding_type: str) -> None:
    common = dict(world_size=world_size, steps=30, init_file=runs.init, sharding_type=sharding_type)
    fused = runs(f"fused_{world_size}_{sharding_type}", tiers=ALL_FUSED, **common)
    tiered = runs(f"tiered_{world_size}_{sharding_type}", tiers=TIERED, **common)
    _compare(fused, tiered)
    losses = harness.read_losses(tiered)
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    # The pipeline prefetched every step of every tiered kernel (3 tables, on some rank).
    counts = harness.read_prefetch_counts(tiered, world_size)
    assert counts and all(c == 30 for c in counts), counts
    # One tiered kernel (one TBE) per rank, whatever the tiers of its tables.
    kernels = harness.read_kernel_tiers(tiered, world_size)
    assert all(len(rank) <= 1 for rank in kernels), kernels
    if world_size == 1:
        assert kernels == [[["SCM", "SSD"]]], kernels


def test_lookahead_window_trains_like_fused_and_resumes(runs, workdir: Path) -> None:
    """Tiered tables with a look-ahead window of 3 behind TieredTrainPipeline(lookahead=3):
    row-wise on two ranks they train as all-FUSED, every batch prefetched; a run killed after
    a checkpoint taken with the window's batches prefetched resumes as if uninterrupted."""
    common = dict(world_size=2, steps=30, init_file=runs.init, sharding_type="row_wise")
    fused = runs("fused_2_row_wise", tiers=ALL_FUSED, **common)
    windowed = runs("tiered_2_row_wise_la3", tiers=TIERED, lookahead=3, **common)
    _compare(fused, windowed)
    counts = harness.read_prefetch_counts(windowed, 2)
    assert counts and all(c == 30 for c in counts), counts
    assert harness.read_lookaheads(windowed, 2) == [3.0] * len(counts)
    ck = str(workdir / "ck15_la3")
    runs("crash_la3", tiers=TIERED, lookahead=3, save_at=15, save_dir=ck, kill_after_save=True, **common)
    resumed = runs("resume_2_la3", world_size=2, steps=30, tiers=TIERED, lookahead=3, restore_from=ck,
                   start_step=15, sharding_type="row_wise")
    _compare(windowed, resumed, first_step_of_b=15)


def _crashed_at_15(runs, workdir_ck: str) -> None:
    runs("crash", world_size=2, steps=30, tiers=TIERED, init_file=runs.init,
         save_at=15, save_dir=workdir_ck, kill_after_save=True)


def test_kill_after_checkpoint_and_resume_same_world_size(runs, workdir: Path) -> None:
    ck = str(workdir / "ck15")
    _crashed_at_15(runs, ck)
    full = runs("tiered_2_table_wise", world_size=2, steps=30, tiers=TIERED, init_file=runs.init)
    resumed = runs("resume_2", world_size=2, steps=30, tiers=TIERED, restore_from=ck, start_step=15)
    _compare(full, resumed, first_step_of_b=15)


def test_resume_into_world_size_1_on_other_tiers(runs, workdir: Path) -> None:
    ck = str(workdir / "ck15")
    _crashed_at_15(runs, ck)
    full = runs("tiered_2_table_wise", world_size=2, steps=30, tiers=TIERED, init_file=runs.init)
    # SSD -> DRAM, SSD -> plain FUSED, SCM -> SSD, FUSED -> SCM.
    swapped = {"ssd_a": "dram", "ssd_b": None, "scm_c": "ssd", "plain_d": "scm"}
    resumed = runs("resume_1_swapped", world_size=1, steps=30, tiers=swapped, restore_from=ck, start_step=15)
    _compare(full, resumed, first_step_of_b=15)


def test_one_kernel_between_fused_tables_trains_like_fused(runs) -> None:
    """A FUSED table between tiered ones in the collection's order: the groups reorder the
    pooled features, which the model reads by name."""
    common = dict(world_size=1, steps=20, init_file=runs.init, sharding_type="table_wise")
    fused = runs("fused_1_20", tiers=ALL_FUSED, **common)
    tiered = runs("ssd_acd_1_20", tiers={"ssd_a": "ssd", "ssd_b": None, "scm_c": "ssd", "plain_d": "ssd"}, **common)
    _compare(fused, tiered)


def test_each_rank_keeps_its_own_files(runs, workdir: Path) -> None:
    runs("tiered_2_table_wise", world_size=2, steps=30, tiers=TIERED, init_file=runs.init)
    storage = workdir / "storage_tiered_2_table_wise"
    per_rank = {p.name: sorted(f.name for f in p.iterdir()) for p in storage.iterdir()}
    assert set(per_rank) == {"rank_0", "rank_1"}
    files = [f for names in per_rank.values() for f in names]
    assert len(files) == len(set(files)) == 3  # three tiered tables, each on one rank
    assert all(f.endswith((".blk", ".scm")) for f in files)
