"""benchmarks/bench_save_order.py on a tiny table: both cases copy every selected row and
report their throughput against the disk's, and the bench leaves no file behind."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import BENCHMARKS


def test_bench_save_order_reports_both_orders(tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCHMARKS / "bench_save_order.py"), "--rows", "30000", "--dim", "16",
           "--chunk-mb", "0.25", "--repeat", "1", "--disk-method", "python", "--dir", str(tmp_path / "work"),
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    for name, rows in (("full", 30000), ("delta", 3000)):
        fig = doc["figures"][name]
        assert fig["rows"] == rows
        assert fig["bytes"] == rows * (16 + 1) * 4
        for case in ("ids", "log"):
            assert fig[f"{case}_bytes_per_s"] > 0 and fig[f"{case}_x_seq_write"] > 0
            assert len(fig["seconds"][case]) == len(fig["reading_seconds"][case]) == 1
        assert fig["log_over_ids"] > 0
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []  # the table and copies went
    assert "log order" in done.stdout
