"""Tests of the store benchmark (benchmarks.lib): workloads, config, report, runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.lib import store
from benchmarks.lib.baselines import rocksdb
from benchmarks.lib.common import make_rows, make_workload, rows_mismatch, zipf_ids
from benchmarks.lib.report import evaluate_targets, format_report
from benchmarks.lib.types import PhaseResult, StoreBenchConfig

# cache-fraction 0.25: the DRAM cache (about 690 rows) holds a whole batch, so warm reads hit.
TINY = ["--rows", "3000", "--batch", "256", "--batches", "2", "--zipf-batches", "2",
        "--write-batches", "2", "--warm-repeats", "2", "--cache-fraction", "0.25",
        "--fio-runtime-s", "1", "--fio-size-mb", "16"]


def test_workload_shapes_and_distinct_batches() -> None:
    kw = dict(rows=1000, batch=100, batches=3, zipf_batches=2, write_batches=2, alpha=1.05, seed=1)
    w = make_workload(**kw)
    assert w.uniform.shape == (3, 100) and w.zipf.shape == (2, 100)
    for b in (*w.uniform, *w.write_each, *w.write_end):
        assert len(np.unique(b)) == len(b)
    assert w.zipf.min() >= 0 and w.zipf.max() < 1000
    again = make_workload(**kw)
    assert np.array_equal(w.zipf, again.zipf)


def test_zipf_is_skewed_and_shuffled() -> None:
    ids = zipf_ids(np.random.default_rng(0), rows=100_000, count=200_000, alpha=1.05)
    counts = np.bincount(ids, minlength=100_000)
    top = np.sort(counts)[::-1]
    assert top[:1000].sum() > 0.4 * len(ids)  # the hottest 1% takes a large share
    assert np.argmax(counts) != 0  # hot ranks are spread over the ids, not ids 0, 1, ...


def test_rows_identify_themselves() -> None:
    ids = np.array([5, 7, 11], dtype=np.int64)
    rows = make_rows(ids, width=129, version=3, seed=0)
    assert rows.dtype == np.float32 and rows.shape == (3, 129)
    assert rows_mismatch(rows, ids) == 0 and rows_mismatch(rows, ids + 1) == 3
    assert np.all(rows[:, -1] == 3) and np.all(np.abs(rows[:, 1:-1]) <= 0.01)


def test_cli_overrides_config_and_quick_overlay(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("rows: 5000\nbatch: 100\nquick:\n  rows: 4000\n  batches: 1\n")
    cfg = store.build_config(["--config", str(cfg_file), "--dir", str(tmp_path)])
    assert (cfg.rows, cfg.batch, cfg.batches) == (5000, 100, StoreBenchConfig.batches)
    cfg = store.build_config(["--config", str(cfg_file), "--quick", "--rows", "3000", "--dir", str(tmp_path)])
    assert (cfg.rows, cfg.batches, cfg.quick) == (3000, 1, True)


def test_bad_values_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert store.main(["--batch", "0", "--dir", str(tmp_path)]) == 2
    assert "batch must be a positive integer, got 0" in capsys.readouterr().err
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("rowz: 5\n")
    with pytest.raises(ValueError, match="unknown keys \\['rowz'\\]"):
        store.load_config(cfg_file, quick=False)


def test_checked_in_config_is_valid() -> None:
    # load_config reads a missing default file as "dataclass defaults": it must be there.
    assert store.DEFAULT_CONFIG.is_file(), store.DEFAULT_CONFIG
    for quick in (False, True):
        values = store.load_config(None, quick)
        assert values, f"{store.DEFAULT_CONFIG} sets nothing (quick={quick})"
        StoreBenchConfig(**values)


def test_targets_and_report_from_figures() -> None:
    cfg = StoreBenchConfig()
    res = {
        "fio": {"randread_4k_qd32": PhaseResult("fio", "randread_4k_qd32", 100_000, 1.0, None, {
            "iops": 100_000.0, "MBps": 400.0, "clat_p50_us": 300.0, "clat_p99_us": 900.0})},
        "ours": {"read_cold_uniform": PhaseResult("ours", "read_cold_uniform", 85_000, 1.0, 0.3),
                 "read_warm": PhaseResult("ours", "read_warm", 1_000_000, 1.0, 0.1)},
        "rocksdb": {"read_cold_uniform": PhaseResult("rocksdb", "read_cold_uniform", 50_000, 1.0, 0.9),
                    "read_warm": PhaseResult("rocksdb", "read_warm", 200_000, 1.0, 0.9)},
    }
    status = {t.name: t.status for t in evaluate_targets(res, cfg)}
    assert status["cold uniform reads >= 80% of fio 4 KiB randread IOPS at QD 32"] == "PASS"
    assert status["cold uniform reads >= 1.5x RocksDB (C++ MultiGet)"] == "PASS"
    assert status["warm reads (DRAM cache) >= 10x RocksDB warm reads"] == "MISS"
    assert status["write-back, flush per batch >= 1x RocksDB WriteBatch+sync"] == "SKIP"
    text = format_report(res, cfg, ["header"], {"memmap": "disabled"})
    assert "SKIPPED memmap: disabled" in text and "[MISS] warm reads" in text


def test_parse_rocksdb_results() -> None:
    out = "noise\nRESULT phase=read_cold rows=10 seconds=0.5 rows_per_s=20\nRESULT phase=load rows=3 seconds=1\n"
    parsed = rocksdb.parse_results(out)
    assert parsed["read_cold"]["rows_per_s"] == 20.0 and parsed["load"]["rows"] == 3.0


def test_tiny_run_memmap_and_store(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc = store.main([*TINY, "--dir", str(tmp_path), "--skip-fio", "--skip-rocksdb", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["results"]["memmap"]["read_cold_uniform"]["errors"] == 0
    if "ours" in doc["results"]:  # the store may not be built in this checkout
        ours = doc["results"]["ours"]
        assert ours["read_warm_out"]["hit_rate"] == 1.0
        assert ours["write_flush_end"]["reopen_errors"] == 0
    assert not list(tmp_path.glob("mtrains-bench-store-*")), "data files must be cleaned up"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None or not Path("/usr/include/rocksdb/db.h").is_file(),
                    reason="needs g++ and librocksdb-dev")
def test_tiny_run_rocksdb_and_fio(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc = store.main([*TINY, "--dir", str(tmp_path), "--skip-ours", "--skip-memmap", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    if shutil.which("fio"):
        assert doc["results"]["fio"]["randread_4k_qd32"]["iops"] > 0
    r = doc["results"]["rocksdb"]
    assert r["read_cold_uniform"]["errors"] == 0 and r["read_warm_rowcache"]["row_cache_hits"] > 0
    assert r["write_flush_each"]["rows"] == 2 * 256


def test_cold_case_target_from_figures() -> None:
    cfg = StoreBenchConfig(case="cold_uniform_32k")
    extra = {"batch": 32768, "table_rows": 4_000_000, "ratios": "0.70,0.90,0.85", "ratio_to_fio": 0.85,
             "rows_per_s_each": "1,2,3", "fio_iops_each": "1,2,3,4", "device_reads": 3.0, "io_engine": "io_uring"}
    res = {"ours": {"cold_uniform_32k": PhaseResult("ours", "cold_uniform_32k", 98_304, 1.0, 0.5, extra)}}
    targets = evaluate_targets(res, cfg)
    assert [t.status for t in targets] == ["PASS"] and targets[0].ratio == 0.85
    res["ours"]["cold_uniform_32k"].extra["ratio_to_fio"] = 0.79
    assert evaluate_targets(res, cfg)[0].status == "MISS"
    del res["ours"]["cold_uniform_32k"].extra["ratio_to_fio"]
    assert evaluate_targets(res, cfg)[0].status == "SKIP"
    assert "cold_uniform_32k: ours" in format_report(res, cfg, ["header"], {})
    with pytest.raises(ValueError, match="case must be one of"):
        StoreBenchConfig(case="cold")
    with pytest.raises(ValueError, match="case_batch"):
        StoreBenchConfig(case_rows=10, case_batch=11)


def test_tiny_cold_case(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["--case", "cold_uniform_32k", "--case-rows", "3000", "--case-batch", "256", "--case-repeats", "2",
            "--case-fio-runtime-s", "1", "--fio-size-mb", "16", "--dir", str(tmp_path), "--json", str(out)]
    if shutil.which("fio") is None:
        args.append("--skip-fio")
    assert store.main(args) == 0
    doc = json.loads(out.read_text())
    if "ours" in doc["results"]:  # the store may not be built in this checkout
        case = doc["results"]["ours"]["cold_uniform_32k"]
        assert case["errors"] == 0 and case["rows"] == 2 * 256
        if shutil.which("fio"):
            assert case["ratio_to_fio"] > 0 and len(case["ratios"].split(",")) == 2
    assert not list(tmp_path.glob("mtrains-bench-store-*")), "data files must be cleaned up"
