"""The Adam benchmark's quick mode: every optimizer gets a step-cost row beside row-wise
Adagrad, the SSD part reads the same rows for both optimizers with the state's row bytes,
and the table files are gone (structure only, no timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_adam


def test_quick_run_reports_both_targets(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out_json = tmp_path / "out.json"
    assert bench_adam.main(["--quick", "--dir", str(tmp_path), "--json", str(out_json)]) == 0
    results = json.loads(out_json.read_text())
    step = results["step"]
    assert list(step["optimizers"]) == list(bench_adam.OPTIMIZERS)
    for o in step["optimizers"].values():
        assert o["ms_per_step"] > 0 and o["baseline_ms_per_step"] > 0 and o["ratio"] > 0
        assert len(o["round_ratios"]) == 2
        assert o["hit_rate"] == 1.0 and o["baseline_hit_rate"] == 1.0  # all cached after the warm-up
    assert isinstance(step["pass"], bool)
    ssd = results["ssd"]
    adam, adagrad = ssd["optimizers"]["adam"], ssd["optimizers"]["exact_rowwise_adagrad"]
    assert adam["misses"] == adagrad["misses"] > 0  # same ids, same cache
    assert adam["unique_rows"] == adagrad["unique_rows"]
    assert (adagrad["row_bytes"], adam["row_bytes"]) == (32 * 4 + 4, 3 * 32 * 4)
    for o in (adam, adagrad):
        assert o["tier_bytes_per_row_read"] == o["row_bytes"]
    assert ssd["misses_ratio"] == 1.0 and ssd["pass"]
    text = capsys.readouterr().out
    for name in bench_adam.OPTIMIZERS:
        assert f"ratio step {name} / exact_rowwise_adagrad = " in text
    assert "ratio ssd misses adam / exact_rowwise_adagrad = 1.0000x" in text
    assert list(tmp_path.glob("bench_adam_*")) == []  # the table files are gone
