"""Tests of the kernel benchmark: Belady's optimum, config, targets/report, a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.lib import kernel
from benchmarks.lib.belady import belady_hits, lru_hits, next_use, static_hits
from benchmarks.lib.kernel_report import evaluate_targets, format_report
from benchmarks.lib.types import KernelBenchConfig, PhaseResult


def _opt_reference(steps: list[list[int]], capacity: int, count_from: int) -> int:
    """OPT by brute force: on a miss with a full cache, evict the farthest next use."""
    trace = [(s, r) for s, ids in enumerate(steps) for r in sorted(set(ids))]
    cache: set[int] = set()
    hits = 0
    for k, (s, row) in enumerate(trace):
        if row in cache:
            hits += s >= count_from
            continue
        if len(cache) == capacity:
            def next_pos(x: int) -> int:
                return next((j for j in range(k + 1, len(trace)) if trace[j][1] == x), len(trace))
            cache.remove(max(cache, key=next_pos))
        cache.add(row)
    return hits


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 25), max_size=12), min_size=1, max_size=8), st.integers(1, 15),
       st.data())
def test_belady_matches_brute_force(steps: list[list[int]], capacity: int, data: st.DataObject) -> None:
    count_from = data.draw(st.integers(0, len(steps)))
    opt = belady_hits([np.array(s, dtype=np.int64) for s in steps], capacity, count_from)
    assert opt.hits == _opt_reference(steps, capacity, count_from)
    assert opt.accesses == sum(len(set(s)) for s in steps[count_from:])


def test_belady_bounds_and_errors() -> None:
    steps = [np.array([1, 2, 3]), np.array([1, 2, 3, 3]), np.array([4])]
    assert belady_hits(steps, 100).hits == 3  # everything fits: only first uses miss
    assert belady_hits(steps, 100).hit_rate == 3 / 7
    assert belady_hits(steps, 100, count_from_step=2).accesses == 1
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        belady_hits(steps, 0)
    with pytest.raises(ValueError, match="count_from_step"):
        belady_hits(steps, 1, count_from_step=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 25), max_size=12), min_size=1, max_size=8), st.integers(1, 15))
def test_lru_never_beats_belady(steps: list[list[int]], capacity: int) -> None:
    arrays = [np.array(s, dtype=np.int64) for s in steps]
    assert lru_hits(arrays, capacity).hits <= belady_hits(arrays, capacity).hits


def test_lru_and_static_by_hand() -> None:
    steps = [np.array([1, 2]), np.array([3]), np.array([1, 3]), np.array([2])]
    # LRU of 2: {1,2} -> 3 evicts 1 -> {2,3}; step 2: 1 misses (evicts 2), 3 hits; step 3: 2 misses.
    assert lru_hits(steps, 2).hits == 1
    assert static_hits(steps, np.array([1, 2]), count_from_step=1).hits == 2  # 1 in step 2, 2 in step 3
    assert static_hits(steps, np.array([1, 2]), count_from_step=1).accesses == 4


def test_next_use() -> None:
    assert next_use(np.array([5, 7, 5, 5, 7])).tolist() == [2, 4, 3, 5, 5]


def test_cli_overrides_config_and_quick_overlay(tmp_path: Path) -> None:
    cfg_file = tmp_path / "k.yaml"
    cfg_file.write_text("rows: 5000\nbatch: 100\npolicies: [lfu]\nquick:\n  rows: 4000\n  blocks: 1\n")
    cfg = kernel.build_config(["--config", str(cfg_file), "--dir", str(tmp_path)])
    assert (cfg.rows, cfg.batch, cfg.blocks, cfg.policies) == (5000, 100, KernelBenchConfig.blocks, ("lfu",))
    cfg = kernel.build_config(["--config", str(cfg_file), "--quick", "--rows", "3000", "--no-fill-scm",
                               "--policies", "lru,lfu", "--dir", str(tmp_path)])
    assert (cfg.rows, cfg.blocks, cfg.quick, cfg.fill_scm, cfg.policies) == (3000, 1, True, False, ("lru", "lfu"))


def test_bad_values_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kernel.main(["--pooling", "0", "--dir", str(tmp_path)]) == 2
    assert "pooling must be a positive integer, got 0" in capsys.readouterr().err
    assert kernel.main(["--policies", "lru,fifo", "--dir", str(tmp_path)]) == 2
    assert "policies must be distinct values" in capsys.readouterr().err
    cfg_file = tmp_path / "k.yaml"
    cfg_file.write_text("rowz: 5\n")
    with pytest.raises(ValueError, match="unknown keys \\['rowz'\\]"):
        kernel.load_config(cfg_file, quick=False)


def test_checked_in_config_is_valid() -> None:
    # load_config reads a missing default file as "dataclass defaults": it must be there.
    assert kernel.DEFAULT_CONFIG.is_file(), kernel.DEFAULT_CONFIG
    for quick in (False, True):
        values = kernel.load_config(None, quick)
        assert values, f"{kernel.DEFAULT_CONFIG} sets nothing (quick={quick})"
        KernelBenchConfig(**values)


def _run(phase: str, system: str, median_ms: float, **extra: float) -> PhaseResult:
    e = {"median_step_ms": median_ms, "steps_per_s": 1e3 / median_ms, "steps": 4,
         "block_median_steps_per_s": f"{1e3 / median_ms:.3f},{1e3 / median_ms:.3f}", **extra}
    return PhaseResult(system, phase, 4, 4 * median_ms / 1e3, None, e)


def test_targets_and_report_from_figures() -> None:
    cfg = KernelBenchConfig()
    fio = {"iops": 50_000.0, "MBps": 1000.0, "clat_p50_us": 500.0, "clat_p99_us": 900.0}
    ours = dict(zipf_alpha=1.05, cache_algorithm="lru", tier="SSD", hit_rate=0.6, cache_capacity_rows=400_000.0,
                rows_loaded_per_step=20_000.0, rows_written_back_per_step=20_000.0)
    res = {
        "fio": {"randread_4k_qd64": PhaseResult("fio", "randread_4k_qd64", 1, 1.0, None, fio),
                "write_1m_seq": PhaseResult("fio", "write_1m_seq", 1, 1.0, None, fio)},
        "ours": {"scm": _run("scm", "ours", 100.0, **ours),
                 "ssd": _run("ssd", "ours", 450.0, **ours),
                 "scm_lfu": _run("scm_lfu", "ours", 120.0, **{**ours, "cache_algorithm": "lfu", "hit_rate": 0.7})},
        "fbgemm": {"scm": _run("scm", "fbgemm", 80.0), "ssd": _run("ssd", "fbgemm", 80.0)},
        "belady": {"zipf": PhaseResult("belady", "zipf", 10, 1.0, None, {
            "hit_rate": 0.72, "capacity": 400_000, "capacity_nominal": 400_000, "counted_from_step": 40,
            "lru_full_assoc_hit_rate": 0.6, "static_top_hit_rate": 0.69,
            "steps": 88, "zipf_alpha": 1.05})},
    }
    targets = {t.name.split(":")[0]: t for t in evaluate_targets(res, cfg)}
    assert targets["SCM tier, cache 10%"].status == "MISS"  # 10 vs 12.5 steps/s = 0.8x
    ssd = targets["SSD tier, Zipf 1.05 workload"]
    # device: 20K reads / 50K IOPS = 400 ms + 20K x 516 B / 1000 MB/s = 10.3 ms; 450 / 410.3 ms
    assert ssd.status == "PASS" and ssd.ratio == pytest.approx(0.450 / 0.41032)
    assert targets["SSD tier, high-locality table (Zipf 1.3)"].status == "SKIP"
    hit = targets["hit rate"]
    assert hit.status == "PASS" and "gap 2.0 points" in hit.detail  # LFU 70% vs Belady 72%
    text = format_report(res, cfg, ["header"], {"x": "why"}, ["noise"])
    assert "SKIPPED x: why" in text and "[PASS] SSD tier" in text and "Belady 72.0%" in text


def test_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "k.json"
    tiny = ["--rows", "3000", "--batch", "64", "--pooling", "4", "--warmup-steps", "3", "--blocks", "2",
            "--high-locality-warmup-steps", "3",
            "--block-steps", "2", "--fill-chunk-rows", "1000", "--skip-fio"]
    assert kernel.main([*tiny, "--dir", str(tmp_path), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    ours = doc["results"]["ours"]
    assert set(ours) == {"ssd", "ssd_high_locality", "scm", "scm_lfu"}
    assert set(doc["results"]["fbgemm"]) == {"ssd", "ssd_high_locality", "scm"}
    assert ours["ssd"]["fill_rows"] == 3000 and ours["ssd"]["steps"] == 4
    # Same trace and policy: the SSD and SCM runs see the same hits.
    assert ours["ssd"]["hit_rate"] == ours["scm"]["hit_rate"]
    ref = doc["results"]["belady"]["zipf"]
    assert 0 <= ours["scm"]["hit_rate"] <= ref["hit_rate"] <= 1
    assert ref["lru_full_assoc_hit_rate"] <= ref["hit_rate"]
    status = {t["name"].split(":")[0]: t["status"] for t in doc["targets"]}
    assert status["SSD tier, Zipf 1.05 workload"] == "SKIP"  # no fio
    assert not list(tmp_path.glob("mtrains-bench-kernel-*")), "data files must be cleaned up"


def test_cli_lists_and_dispatches_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    from torchrec_mtrains import cli

    assert "kernel" in cli.COMMANDS.commands["bench"].commands
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "kernel", "--help"])
    assert e.value.code == 0 and "usage: mtrains bench kernel" in capsys.readouterr().out


def test_tiny_sequence_run(tmp_path: Path) -> None:
    """--sequence: both systems look ids up unpooled (PoolingMode.NONE) on the same trace."""
    out = tmp_path / "k.json"
    tiny = ["--rows", "3000", "--batch", "64", "--pooling", "4", "--warmup-steps", "3", "--blocks", "2",
            "--block-steps", "2", "--fill-chunk-rows", "1000", "--skip-fio", "--skip-ssd", "--skip-high-locality",
            "--skip-policies", "--skip-belady", "--sequence"]
    assert kernel.main([*tiny, "--dir", str(tmp_path), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["results"]["ours"]) == {"scm"} and set(doc["results"]["fbgemm"]) == {"scm"}
    assert doc["results"]["ours"]["scm"]["steps"] == 4 and 0 < doc["results"]["ours"]["scm"]["hit_rate"] <= 1
