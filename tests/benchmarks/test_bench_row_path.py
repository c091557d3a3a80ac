"""A scaled-down run of the row-path benchmark: its figures add up, its stage keys are the
kernel's, and --compare measures another checkout's package (here: this one's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_row_path
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--quick", "--rows", "20000", "--tiers", "scm,ssd", "--dir", str(tmp_path),
            "--json", str(tmp_path / "out.json"), *extra]


def test_quick_run_reports_each_tier(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert bench_row_path.main(_args(tmp_path)) == 0
    results = json.loads((tmp_path / "out.json").read_text())
    assert [r["tier"] for r in results] == ["SCM", "SSD"]
    for r in results:
        assert r["rows_loaded_per_step"] > 0
        assert r["ours_ms_per_step"] > 0 and r["fbgemm_ms_per_step"] > 0
        assert r["ratio_vs_fbgemm"] > 0
        for stage in bench_row_path.STAGES:
            assert r[f"{stage}_cpu_ns_per_row"] >= 0
        assert r["read_cpu_ns_per_row"] > 0
        assert r["kernel_cpu_ns_per_miss"] >= r["read_cpu_ns_per_row"]
    out = capsys.readouterr().out
    assert "row path CPU per miss" in out and "kernel's stages" in out
    assert list(tmp_path.glob("row_path_*")) == []  # the table files are gone


def test_compare_runs_the_other_checkout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--quick", "--rows", "20000", "--tiers", "scm", "--dir", str(tmp_path),
            "--json", str(tmp_path / "out.json"), "--compare", str(REPO_ROOT)]
    assert bench_row_path.main(args) == 0
    (r,) = json.loads((tmp_path / "out.json").read_text())
    assert r["other_checkout"]["tier"] == "SCM"
    assert r["other_checkout"]["rows_loaded_per_step"] == r["rows_loaded_per_step"]  # same batches, same cache
    assert "vs the other checkout" in capsys.readouterr().out
