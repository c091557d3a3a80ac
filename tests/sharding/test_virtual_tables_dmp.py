"""Stock TorchRec code for a virtual table -- EmbeddingBagConfig(use_virtual_table=True,
total_num_buckets=..., virtual_table_eviction_policy=...), ParameterConstraints with a
virtual-table compute kernel, TorchRec's EmbeddingShardingPlanner, DMP -- trains on the CPU
with the tiered sharder on 2 gloo ranks (tests/support/virtual_dmp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import virtual_dmp

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _run(tmp_path: Path, name: str, world: int, kernel: str, **kw) -> list:
    out = tmp_path / name
    out.mkdir()
    spec = virtual_dmp.VirtualRun(out_dir=str(out), world_size=world, kernel=kernel,
                                  storage_dir=str(tmp_path / f"storage_{name}"), **kw)
    assert virtual_dmp.launch(spec) == [0] * world
    return virtual_dmp.read(str(out), world)


def test_virtual_kernels_train_alike_on_one_and_two_ranks(tmp_path: Path) -> None:
    """Row-wise by buckets, each row's initial value by global id: the losses of a global
    batch do not depend on the world size or on the tier."""
    one = _run(tmp_path, "dram1", 1, "dram_virtual_table", plain_weight=0.0)
    two = _run(tmp_path, "dram2", 2, "dram_virtual_table", plain_weight=0.0)
    ssd = _run(tmp_path, "ssd2", 2, "ssd_virtual_table", plain_weight=0.0)
    both = _run(tmp_path, "dram_ssd2", 2, "dram_ssd_virtual_table", plain_weight=0.0)
    base = one[0]["losses"]
    for run in (two, ssd, both):
        assert run[0]["losses"] == run[1]["losses"]
        assert max(abs(a - b) for a, b in zip(base, run[0]["losses"])) <= 1e-6 * max(abs(x) for x in base)
    assert ssd[0]["losses"] == two[0]["losses"] == both[0]["losses"], "the tier does not change the math"
    for run in (two, ssd, both):
        assert all(r["sharding"] == "row_wise" for r in run)
        shards = [s for r in run for s in r["virtual"].values()]
        assert len(shards) == 2 and all(s["live_ids"] > 0 for s in shards)
    # The two ranks' shards hold the ids one rank holds.
    assert sum(s["live_ids"] for r in two for s in r["virtual"].values()) == \
        sum(s["live_ids"] for s in one[0]["virtual"].values())
    assert list((tmp_path / "storage_ssd2").rglob("*.blk")), "ssd_virtual_table keeps its rows in block stores"


@pytest.mark.parametrize("kernel", ["dram_virtual_table", "ssd_virtual_table"])
def test_storage_aware_planner_plans_virtual_tables(tmp_path: Path, kernel: str) -> None:
    """The same constraints to the StorageAwarePlanner: the table row-wise by buckets on the
    kernel's tier, sized by its live ids; training as under TorchRec's planner."""
    torchrec = _run(tmp_path, "torchrec", 2, kernel, plain_weight=0.0)
    ours = _run(tmp_path, "ours", 2, kernel, plain_weight=0.0, planner="storage_aware")
    assert ours[0]["losses"] == torchrec[0]["losses"]
    for rank in ours:
        assert rank["sharding"] == "row_wise"
        (shard,) = rank["virtual"].values()
        assert shard["capacity"] < 2**20  # sized by its live ids (the policy's trigger), not 2^39 ids


def test_count_policy_evicts_on_each_rank(tmp_path: Path) -> None:
    run = _run(tmp_path, "evict", 2, "dram_virtual_table", trigger=300, steps=16)
    for rank in run:
        (shard,) = rank["virtual"].values()
        assert shard["eviction_passes"] >= 1 and shard["ids_evicted"] > 0
        assert shard["live_ids"] <= 300 + 200  # the trigger plus a step's new ids
        assert shard["index_bytes_per_row_used"] <= 16.0  # the index at its peak: bytes per live id then
