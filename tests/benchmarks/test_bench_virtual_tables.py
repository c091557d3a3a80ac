"""benchmarks/bench_virtual_tables.py, tiny: the kernel part times both cases and reports
their ratio and the index's bytes per live id; the example part runs every case and leaves
no file behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import BENCHMARKS


def _bench(tmp_path, *args: str) -> dict:
    out = tmp_path / "figures.json"
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_virtual_tables.py"), *args, "--dir", str(work),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(work.iterdir()) == []
    return json.loads(out.read_text())


def test_kernel_part_reports_both_cases(tmp_path) -> None:
    doc = _bench(tmp_path, "--parts", "kernel", "--live", "20000", "--batch", "2048", "--steps", "4", "--repeat", "1",
                 "--tier", "dram")
    k = doc["kernel"]
    for phase in ("first_pass", "steady"):
        assert k[phase]["virtual_steps_s"] > 0 and k[phase]["dense_steps_s"] > 0 and k[phase]["ratio"] > 0
    assert 8.0 <= k["index_bytes_per_live_id"] <= 32.0  # small tables: the index's minimum sizes weigh more


@pytest.mark.slow
def test_example_part_runs_every_case(tmp_path) -> None:
    doc = _bench(tmp_path, "--parts", "example", "--example-steps", "12", "--example-repeat", "1",
                 "--hashed-rows", "5000")
    e = doc["example"]
    assert sorted(e) == ["dense", "hashed_5000", "virtual"]
    assert all(0 < r["auc"] <= 1 and r["qps"] > 0 for r in e.values())
    assert e["virtual"]["runs"][0]["index_bytes_per_live_id"] > 0
