"""A scaled-down run of the plan benchmark: both cases report both indexes' figures, the
ratio and the target's verdict, and every measured plan was all hits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_plan


def test_quick_run_reports_map_on_and_off(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert bench_plan.main(["--quick", "--json", str(tmp_path / "out.json")]) == 0
    results = json.loads((tmp_path / "out.json").read_text())
    assert [r["case"] for r in results] == ["table_1m", "table_8m"]
    for r in results:
        assert r["rows"] == r["slots"] * (1 if r["case"] == "table_1m" else 8)
        assert len(r["on_blocks_ns_per_id"]) == len(r["off_blocks_ns_per_id"]) == 3
        assert r["off_ns_per_id"] > 0 and r["on_ns_per_id"] > 0
        assert r["ratio_on_off"] == pytest.approx(r["on_ns_per_id"] / r["off_ns_per_id"])
        assert r["pass"] == (r["on_ns_per_id"] <= bench_plan.TARGET_NS_PER_ID)
    out = capsys.readouterr().out
    assert out.count("target <= 8 ns/id [") == 2 and "map off" in out and "map on" in out


def test_unknown_case_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench_plan.main(["--cases", "table_2m"])
