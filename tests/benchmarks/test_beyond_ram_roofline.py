"""The beyond-RAM CPU roofline and its ceiling (benchmarks/lib/beyond_ram_roofline.py) on
hand-made run metrics: the slowest rank's reads set the roofline, Belady's reads per shard
leave out each row's first miss and go to the shard's rank."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lib.belady import belady_hits
from benchmarks.lib.beyond_ram_roofline import (SsdTrace, belady_reads_by_rank, cpu_roofline,
                                                fio_cpu_seconds_per_read, roofline_figures, ssd_trace)


def test_cpu_per_read_and_roofline() -> None:
    # fio: 20% user + 30% system of one CPU over 10 s and 1,000,000 reads: 5 us a read.
    assert fio_cpu_seconds_per_read(20.0, 30.0, 10.0, 1_000_000) == pytest.approx(5e-6)
    # 0.1 s of compute; the slowest rank reads 10,000 times a step at 5 us on 2 cores: +25 ms.
    assert cpu_roofline(0.1, [4_000.0, 10_000.0], 5e-6, 2.0) == pytest.approx(0.125)


def _metrics(steps: int) -> dict:
    shard = {"tier": "SSD", "store_device_reads": 50.0, "store_disk_rows_read": 100.0,
             "cache_cache_capacity_rows": 3}
    return {
        # step_times: each step's clock (0.2 s a step)
        "world_size": 2, "step_times": [0.2 * i for i in range(steps)], "table_rows": {"a": 10, "b": 10},
        "tiers": {"shards": {"a.r0.c0": {**shard, "rank": 0}, "a.r5.c0": {**shard, "rank": 1},
                             "b.r0.c0": {**shard, "rank": 1}, "c.r0.c0": {"tier": "DRAM"}},
                  "ranks": [{"tier_device_reads": 40.0}, {"tier_device_reads": 80.0}]},
    }


def test_belady_reads_go_to_each_shards_rank() -> None:
    rng = np.random.default_rng(0)
    steps = 20
    trace = SsdTrace({"a": [rng.integers(0, 10, 6) for _ in range(steps)],
                      "b": [rng.integers(0, 10, 6) for _ in range(steps)]})
    want = [0.0, 0.0]
    for table, lo, hi, rank in (("a", 0, 5, 0), ("a", 5, 10, 1), ("b", 0, 10, 1)):
        shard = trace.shard_steps(table, lo, hi)
        opt = belady_hits(shard, 3, 0)
        first = np.unique(np.concatenate(shard)).size
        want[rank] += (opt.accesses - opt.hits - first) * 0.5 / steps  # 50 device reads per 100 rows read
    assert belady_reads_by_rank(_metrics(steps), trace) == pytest.approx(want)
    unranked = _metrics(steps)
    del unranked["tiers"]["shards"]["b.r0.c0"]["rank"]
    assert belady_reads_by_rank(unranked, trace) is None


def test_figures_put_the_run_between_roofline_and_ceiling() -> None:
    m = _metrics(10)
    r = roofline_figures(m, 0.2, 0.1, 5e-6, 1.0, [1_000.0, 2_000.0])
    assert r["reads_per_step_by_rank"] == [4.0, 8.0]
    assert r["cpu_roofline_step_seconds"] == pytest.approx(0.1 + 8.0 * 5e-6)
    assert r["step_over_cpu_roofline"] == pytest.approx(0.2 / r["cpu_roofline_step_seconds"])
    assert r["ceiling_step_seconds"] == pytest.approx(0.1 + 2_000.0 * 5e-6)
    assert r["ceiling_qps_ratio"] == pytest.approx(0.1 / 0.11)
    assert r["qps_ratio_over_ceiling"] == pytest.approx((0.1 / 0.2) / (0.1 / 0.11))
    assert "ceiling_step_seconds" not in roofline_figures(m, 0.2, 0.1, 5e-6, 1.0, None)


def test_the_runs_trace_is_regenerated_from_its_flags() -> None:
    """ssd_trace gives each step's ids of the named tables from every rank's batch, as the
    example's data makes them: within the table, both ranks' lookups, the same every time."""
    import sys

    from tests.support.paths import EXAMPLE_DLRM

    flags = ["--preset", "beyond-ram", "--table-scale", "0.0005", "--batch-size", "16"]
    trace = ssd_trace(flags, ["z0_400m"], 3, 2)
    again = ssd_trace(flags, ["z0_400m"], 3, 2)
    sys.path.insert(0, str(EXAMPLE_DLRM))
    import train
    from data import SyntheticData, scaled_tables

    args = train.parse_args(flags)
    data = SyntheticData(scaled_tables(args.table_scale, args.tables), args.batch_size, args.seed, args.drift)
    for step, ids in enumerate(trace.tables["z0_400m"]):
        want = np.concatenate([data.batch(step, r).sparse_features.to_dict()["f_z0_400m"].values().numpy()
                               for r in (0, 1)])
        assert np.array_equal(ids, want) and np.array_equal(ids, again.tables["z0_400m"][step])
        assert ids.size > 0 and ids.min() >= 0 and ids.max() < 200_000
