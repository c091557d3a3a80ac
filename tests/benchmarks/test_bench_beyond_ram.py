"""The beyond-RAM run scaled down: the same path (train.py --preset beyond-ram under torchrun,
2 ranks, DMP, the planner on the local profile) at small sizes trains, checkpoints and
resumes bit-identically; and benchmarks/bench_beyond_ram.py reports its figures."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.support.paths import BENCHMARKS, EXAMPLE_DLRM
from tests.support.watch import run_watched

TRAIN = str(EXAMPLE_DLRM / "train.py")
STEPS = 12
# The preset's tables at 1/2000 of their rows (400M -> 200K), small batches, and a DRAM budget
# that puts the large tables on SSD and SCM behind caches.
SMALL = ["--preset", "beyond-ram", "--table-scale", "0.0005", "--batch-size", "64", "--dram-budget", "6MiB",
         "--eval-batches", "1", "--log-every", "3"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MTRAINS_FAULT", "TORCHELASTIC"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*args: str):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN, *SMALL, *args]
    proc = run_watched(cmd, stall_s=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _metrics(out) -> dict:
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_scaled_down_beyond_ram_run_trains_checkpoints_and_resumes_exactly(tmp_path):
    store = str(tmp_path / "store")
    _torchrun("--steps", str(STEPS), "--storage-dir", store + "0", "--out", str(tmp_path / "whole"))
    whole = _metrics(tmp_path / "whole")
    assert len(whole["losses"]) == STEPS and whole["world_size"] == 2
    assert {"SSD"} <= set(whole["placement"].values())
    # What the tiers hold and moved is reported per shard, from both ranks.
    tiers = whole["tiers"]
    assert tiers["materialised_bytes"]["SSD"] > 0 and len(tiers["memory"]) == 2
    ssd = [s for s in tiers["shards"].values() if s["tier"] == "SSD"]
    assert ssd and all(s["store_live_rows"] > 0 for s in ssd)
    assert all(s["materialised_bytes"] == s["store_live_rows"] * s["row_bytes"] for s in ssd)

    ckpt = str(tmp_path / "ckpt")
    _torchrun("--steps", str(STEPS // 2), "--checkpoint-every", str(STEPS // 2), "--checkpoint-dir", ckpt,
              "--storage-dir", store + "1", "--out", str(tmp_path / "first"))
    _torchrun("--steps", str(STEPS), "--resume", "--checkpoint-dir", ckpt, "--storage-dir", store + "2",
              "--out", str(tmp_path / "resumed"))
    resumed = _metrics(tmp_path / "resumed")
    assert resumed["resumed_from"] == STEPS // 2
    assert resumed["losses"] == whole["losses"]  # bit-identical to the uninterrupted run


@pytest.mark.slow
@pytest.mark.multiprocess
def test_bench_beyond_ram_reports_side_by_side(tmp_path):
    """Where a memory cgroup can be made (as on the project's machines), the tiered run goes
    in one of 4 GiB (--memory-limit), the report measures against it, and a sweep trains the
    tiered job again at two ratios of rows written to memory: one with room to spare, one
    whose limit is below what the processes need (stopped for memory: reported, not fatal)."""
    from benchmarks.lib.memory_cgroup import MemoryCgroup, MemoryCgroupUnavailable

    try:
        MemoryCgroup(4 << 30).close()
        capped = ["--memory-limit", "4GiB", "--dram-budget", "48MiB", "--sweep", "0.001,0.2"]
    except MemoryCgroupUnavailable:
        capped = []
    out = tmp_path / "bench"
    cmd = [sys.executable, str(BENCHMARKS / "bench_beyond_ram.py"), "--steps", "8",
           "--table-scale", "0.0005", "--baseline-steps", "6", "--baseline-rows", "1000", "--fio-seconds", "1",
           "--interval", "0.5", "--out", str(out), "--dir", str(tmp_path / "work"), *capped]
    proc = run_watched(cmd, stall_s=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "beyond_ram.json") as f:
        figures = json.load(f)
    if capped:
        group = figures["memory_cgroup"]
        assert group["limit_bytes"] == 4 << 30 and 0 < group["peak_bytes"] <= 4 << 30 and group["oom_kills"] == 0
        assert figures["ram_bytes"] == 4 << 30
        assert "memory cgroup (--memory-limit" in (out / "summary.txt").read_text()
        roomy, tight = figures["sweep"]
        written = sum(figures["materialised_bytes"].values())
        assert roomy["ratio"] == 0.001 and roomy["finished"] and roomy["limit_bytes"] == int(written / 0.001)
        assert roomy["qps_ratio"] > 0 and len(roomy["rank_tier_rows_read"]) == 2
        assert roomy["memory_cgroup"]["peak_bytes"] <= roomy["limit_bytes"]
        assert tight["ratio"] == 0.2 and not tight["finished"] and '"oom_kills": ' in tight["error"]
        assert (out / "sweep.png").stat().st_size > 0
        assert "memory sweep" in (out / "summary.txt").read_text()
    assert figures["steps"] == 8 and figures["qps_steady"] > 0 and figures["baseline"]["qps_steady"] > 0
    assert figures["qps_ratio"] == pytest.approx(figures["qps_steady"] / figures["baseline"]["qps_steady"])
    assert max(figures["baseline"]["table_rows"].values()) <= 1000
    assert figures["peak_rss_bytes"] > 0 and figures["samples"]
    assert (out / "memory_disk.png").stat().st_size > 0
    assert "QPS ratio tiered / baseline" in (out / "summary.txt").read_text()
    # The CPU roofline, and its ceiling (Belady's reads over the run's own trace, regenerated)
    # where SSD tables read (scaled down, the planner may put the big tables on SCM).
    roof = figures["cpu_roofline"]
    assert roof["cpu_seconds_per_read"] > 0 and len(roof["reads_per_step_by_rank"]) == 2
    assert roof["cpu_roofline_step_seconds"] >= roof["compute_step_seconds"] > 0
    assert "CPU roofline" in (out / "summary.txt").read_text()
    with open(out / "tiered" / "metrics.json") as f:
        ssd = any(s["tier"] == "SSD" for s in json.load(f)["tiers"]["shards"].values())
    if ssd:
        assert roof["ceiling_step_seconds"] <= roof["cpu_roofline_step_seconds"] * 1.0001
        assert len(roof["belady_reads_per_step_by_rank"]) == 2
    if capped:
        assert "cpu_roofline" in roomy


def test_disk_use_counts_a_linked_file_once(tmp_path):
    from benchmarks.lib.process_monitor import directory_bytes

    (tmp_path / "store").mkdir()
    (tmp_path / "ckpt").mkdir()
    data = tmp_path / "store" / "t.blk"
    data.write_bytes(os.urandom(1 << 16))
    alone = directory_bytes(str(tmp_path))
    os.link(data, tmp_path / "ckpt" / "t.blk")  # a checkpoint's link: no new blocks
    assert directory_bytes(str(tmp_path)) == alone >= 1 << 16


def test_the_resume_check_compares_every_loss_after_the_checkpoint_and_the_auc():
    from benchmarks.lib.beyond_ram import resume_check

    first = {"losses": [0.5, 0.4, 0.3, 0.2], "auc": 0.7}
    peaks = {"rss": 1, "disk_bytes": 2}

    def resumed(losses, auc=0.7):
        return {"losses": losses, "auc": auc, "wall_seconds": 9.0, "step_times": [0.0, 1.0]}

    ok = resume_check(first, resumed([0.5, 0.4, 0.3, 0.2]), 2, peaks)
    assert ok["losses_identical"] and ok["auc_identical"] and ok["steps_compared"] == 2
    assert not resume_check(first, resumed([0.5, 0.4, 0.3, 0.2000001]), 2, peaks)["losses_identical"]
    assert not resume_check(first, resumed([0.5, 0.4, 0.3]), 2, peaks)["losses_identical"]
    assert not resume_check(first, resumed([0.5, 0.4, 0.3, 0.2], auc=0.71), 2, peaks)["auc_identical"]


def test_crashed_after_leaves_the_directory_as_a_crash_after_that_save(tmp_path):
    from benchmarks.lib.beyond_ram import crashed_after

    from torchrec_mtrains.checkpoint.chain import latest_checkpoint

    for step in (10, 20, 30):
        (tmp_path / f"step_{step:08d}").mkdir()
        (tmp_path / f"step_{step:08d}" / "trainer.json").write_text("{}")
    (tmp_path / "latest").write_text("step_00000030")
    crashed_after(tmp_path, 20)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000010", "step_00000020"]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "step_00000020")


def _memory_cgroup_or_skip(limit: int):
    from benchmarks.lib.memory_cgroup import MemoryCgroup, MemoryCgroupUnavailable

    try:
        return MemoryCgroup(limit)
    except MemoryCgroupUnavailable as e:
        pytest.skip(f"no memory cgroup here: {e}")


_TOUCH = ("import sys; n = int(sys.argv[1]) << 20; b = bytearray(n); "
          "b[::4096] = b'x' * len(range(0, n, 4096)); print('touched', n)")


def test_memory_cgroup_caps_what_its_processes_hold():
    """A child in a 64 MiB group runs when it touches 16 MiB and is killed for memory when it
    touches 256 MiB; the group's peak never passes the limit."""
    import subprocess

    limit = 64 << 20
    with _memory_cgroup_or_skip(limit) as group:
        small = subprocess.run([sys.executable, "-c", _TOUCH, "16"], preexec_fn=group.enter,
                               capture_output=True, text=True, timeout=120)
        assert small.returncode == 0, small.stderr
        big = subprocess.run([sys.executable, "-c", _TOUCH, "256"], preexec_fn=group.enter,
                             capture_output=True, text=True, timeout=120)
        used = group.usage()
    assert big.returncode != 0 and "touched" not in big.stdout
    assert used["limit_bytes"] == limit and 16 << 20 <= used["peak_bytes"] <= limit
    assert used["oom_kills"] >= 1
    assert not group.path.exists()  # removed on exit


def test_memory_cgroup_unavailable_names_the_controller(tmp_path):
    from benchmarks.lib.memory_cgroup import MemoryCgroup, MemoryCgroupUnavailable

    with pytest.raises(MemoryCgroupUnavailable, match=f"no cgroup v1 memory controller at {tmp_path}"):
        MemoryCgroup(64 << 20, root=tmp_path)
    with pytest.raises(ValueError, match="below 1 MiB"):
        MemoryCgroup(4096, root=tmp_path)


def test_memory_limit_flag_is_checked_before_any_run(tmp_path):
    from benchmarks.lib import beyond_ram

    with pytest.raises(SystemExit, match="--memory-limit"):
        beyond_ram.main(["--memory-limit", "lots", "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "w")])


def test_the_dram_budget_within_a_memory_limit_shrinks_with_it():
    from benchmarks.lib.beyond_ram import MIN_BUDGET_BYTES, RANK_BASE_BYTES, budget_within

    gib = 1 << 30
    # Two ranks in 4 GiB: half of what their 1.25 GiB bases leave, per rank (384 MiB).
    assert budget_within(4 * gib, 2) == (4 * gib - 2 * RANK_BASE_BYTES) // 4 == 384 << 20
    assert budget_within(16 * gib, 2) > budget_within(8 * gib, 2) > budget_within(4 * gib, 2)
    assert budget_within(8 * gib, 4) < budget_within(8 * gib, 2)
    assert budget_within(2 * gib, 2) == MIN_BUDGET_BYTES  # below the bases: the smallest cache
    assert budget_within(5 * gib + 12345, 2) % (1 << 20) == 0  # whole MiB


def test_sweep_without_a_memory_limit_starts(tmp_path, monkeypatch):
    """--sweep alone (no --memory-limit) gets past the checks before the runs: the figures are
    then measured against the machine's RAM."""
    from benchmarks.lib import beyond_ram

    def stop(*args, **kwargs):
        raise SystemExit("stopped before the runs")

    monkeypatch.setattr(beyond_ram, "fio_limits", stop)
    monkeypatch.setattr(beyond_ram, "_memory_cgroup", lambda limit: _memory_cgroup_or_skip(limit))
    with pytest.raises(SystemExit, match="stopped before the runs"):
        beyond_ram.main(["--sweep", "2", "--out", str(tmp_path / "out"), "--dir", str(tmp_path / "w")])
