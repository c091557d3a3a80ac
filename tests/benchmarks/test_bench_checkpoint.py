"""benchmarks/bench_checkpoint.py: the keep-chains replay behind its disk-use figure, and the
bench itself on a tiny configuration (1 rank, a few steps, small tables on SSD) reporting
every save of both runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.lib.checkpoints_report import keep_chains_replay
from tests.support.paths import BENCHMARKS
from tests.support.watch import run_watched

BENCH = str(BENCHMARKS / "bench_checkpoint.py")
STEPS, EVERY = 6, 2
TINY = "--table-scale 0.02 --batch-size 64 --dram-budget 8MiB --eval-batches 0 --log-every 2"


def _save(step: int, kind: str, nbytes: int) -> dict:
    return {"step": step, "kind": kind, "bytes": nbytes}


def test_keep_chains_replay_peaks_before_the_old_chain_goes():
    saves = [_save(1, "full", 100), _save(2, "delta", 10), _save(3, "delta", 20), _save(4, "full", 150),
             _save(5, "delta", 5)]
    # Before step 4's cleanup: the chain of 1 (130) and step 4 (150); then only 4 and 5 stay.
    assert keep_chains_replay(saves, 1) == (280, [4, 5])
    assert keep_chains_replay(saves, 2) == (285, [1, 2, 3, 4, 5])
    assert keep_chains_replay([_save(1, "full", 7), _save(2, "full", 9)], 1) == (16, [2])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_bench_checkpoint_accounts_for_every_save(tmp_path):
    out = tmp_path / "results.json"
    cmd = [sys.executable, BENCH, "--steps", str(STEPS),
           "--checkpoint-every", str(EVERY), "--full-every", "3", "--example-args", TINY, "--disk-method", "python",
           "--disk-mb", "8", "--nproc", "1", "--workdir", str(tmp_path / "work"), "--out", str(out),
           "--quantize", "int8", "--resume-steps", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MTRAINS_FAULT", "TORCHELASTIC"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = run_watched(cmd, stall_s=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    raw, f = doc["raw"], doc["figures"]
    assert raw["disk"]["write_bytes_per_s"] > 0 and raw["disk"]["read_bytes_per_s"] > 0
    assert raw["disk"]["method"].startswith("python loop")
    for name in ("baseline", "measured", "async", "int8"):
        run = f["runs"][name]
        steps = [s["step"] for s in run["saves"]]
        assert steps == list(range(EVERY, STEPS + 1, EVERY))
        a = run["accounting"]
        assert a["missing_saves"] == [] and a["unexpected_saves"] == [] and a["size_mismatches"] == {}
        assert a["on_disk_at_end"] == a["kept_by_rule"] and a["on_disk_at_end"]
        assert run["total_bytes"] == sum(s["bytes"] for s in raw["runs"][name]["checkpoints"])
        assert 0 < run["time_share"] < 1 and run["peak_disk_bytes_sampled"] > 0
    base, meas = f["runs"]["baseline"], f["runs"]["measured"]
    assert base["deltas"] == 0 and meas["deltas"] >= 1
    assert f["same_training"]
    assert f["write_reduction"] == pytest.approx(base["total_bytes"] / meas["total_bytes"])
    assert f["capacity_reduction_peak_by_rule"] == pytest.approx(
        base["peak_disk_bytes_by_rule"] / meas["peak_disk_bytes_by_rule"])
    delta = next(s for s in meas["saves"] if s["kind"] == "delta")
    assert delta["row_bytes"] > 0
    assert delta["bytes_x_rows"] == pytest.approx((delta["bytes"] - delta["dense_bytes"]) / delta["row_bytes"])
    # Saves in the background stop training for their snapshot only; the resumes restored.
    stalls = f["stall_steps"]["async"]
    assert [s for s, _ in stalls] == list(range(EVERY, STEPS + 1, EVERY)) and all(v > 0 for _, v in stalls)
    for name in ("measured", "int8"):
        assert f["resumed"][name]["resumed_from"] == STEPS and f["resumed"][name]["restore_seconds"] > 0
    assert raw["no_saves"]["losses"] == raw["runs"]["baseline"]["losses"]
    assert set(f["lost_steps_per_save"]) == {"baseline", "measured", "async", "int8"}
    statuses = {t["name"]: t["status"] for t in doc["targets"]}
    assert statuses["every save accounted for, same training in both runs"] == "PASS"
    assert all(s in ("PASS", "MISS", "SKIP", "INFO") for s in statuses.values())
    assert not (tmp_path / "work" / "measured" / "ckpt").exists()  # removed without --keep

    again = subprocess.run([sys.executable, BENCH, "--report-only", str(out)], capture_output=True, text=True, env=env,
                           check=True)
    assert "targets:" in again.stdout and "write reduction" in again.stdout
