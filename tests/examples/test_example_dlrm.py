"""examples/dlrm: the torchx launch of the tiered DLRM, checkpoint/resume, bad input.

The slow tests launch the example as a user does (torchx, local_cwd scheduler, 2 ranks on
gloo), about 1.5 minutes on 2 cores together. The fast ones check the planner's placement, the
AUC and the atomic output on their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.support.paths import EXAMPLE_DLRM, REPO_ROOT, add_example_to_path
from torchrec_mtrains import Tier

add_example_to_path()
from placement import (TableInfo, check_fits, is_tiered, load_hardware, make_planner, parse_bytes,  # noqa: E402
                       placement_rows, tier_of)
from report import auc, write_outputs  # noqa: E402

STEPS = 30


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchx starts torchrun
    return env


def _torchx(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchx"), "run", "-s", "local_cwd", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def _metrics(out) -> dict:
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dlrm") / "out"
    proc = _torchx("examples/dlrm/component.py:dlrm", "--", "--steps", str(STEPS), "--out", str(out))
    assert "Job finished: SUCCEEDED" in proc.stderr + proc.stdout, proc.stderr[-4000:]
    (out.parent / "launch.log").write_text(proc.stdout + proc.stderr)  # for the output check below
    return _metrics(out), out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_component_launch_learns(default_run) -> None:
    m, out = default_run
    losses = m["losses"]
    assert len(losses) == STEPS and m["world_size"] == 2
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05
    assert m["auc"] > 0.65
    assert m["qps"] > 0 and m["predicted_qps"] > 0
    assert m["input_seconds_per_sample"] > 0  # measured: the planner's step includes making the batches
    assert {"SSD", "SCM", "DRAM"} <= set(m["placement"].values())  # the default budget needs SCM and SSD
    tiered = {t for t, tier in m["placement"].items() if tier in ("SSD", "SCM")}
    assert set(m["hit_rate"]) == tiered and all(0 < h <= 1 for h in m["hit_rate"].values())
    # Warm caches (the run's last quarter) hit at least as often as the whole run, cold start included.
    assert m["hit_rate_warm_from_step"] >= 3 * STEPS // 4 and set(m["hit_rate_warm"]) == tiered
    assert all(m["hit_rate_warm"][t] >= m["hit_rate"][t] - 0.02 for t in tiered)
    # Each rank's tier rows: the first touches (made in place) are counted apart from the rows
    # read, and the summary's balance is over the rows read.
    ranks = m["tiers"]["ranks"]
    assert len(ranks) == 2 and all(0 < r["tier_first_touches"] <= r["tier_rows_read"] for r in ranks)
    read = [r["tier_rows_read"] - r["tier_first_touches"] for r in ranks]
    summary = (out / "summary.txt").read_text()
    assert f"rows read max / mean {max(read) / (sum(read) / 2):.2f}" in summary, summary


@pytest.mark.slow
@pytest.mark.multiprocess
def test_component_launch_prints_no_framework_warnings(default_run) -> None:
    # Python warnings ("FutureWarning: ...") and torch's glog-style ones ("W1202 02:16:16 ...",
    # torchrun's OMP_NUM_THREADS notice among them): the user can act on none of those.
    lines = (default_run[1].parent / "launch.log").read_text().splitlines()
    noise = [line for line in lines if "Warning" in line or re.search(r"(^|[\s:\]])W\d{4} \d\d:\d\d:\d\d", line)]
    assert noise == [], "\n".join(noise[:10])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_continues_exactly(default_run, tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt")
    first = _torchx("dist.ddp", "-j", "1x2", "--script", "examples/dlrm/train.py", "--",
                    "--steps", "15", "--checkpoint-every", "15", "--checkpoint-dir", ckpt, "--out", str(tmp_path / "a"))
    assert "SUCCEEDED" in first.stderr + first.stdout, first.stderr[-4000:]
    second = _torchx("dist.ddp", "-j", "1x2", "--script", "examples/dlrm/train.py", "--",
                     "--steps", str(STEPS), "--resume", "--checkpoint-dir", ckpt, "--out", str(tmp_path / "b"))
    assert "SUCCEEDED" in second.stderr + second.stdout, second.stderr[-4000:]
    resumed = _metrics(tmp_path / "b")
    assert resumed["resumed_from"] == 15
    assert resumed["losses"] == default_run[0]["losses"]  # bit-identical to the uninterrupted run


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--no-such-flag"], "unrecognized arguments"),
    (["--dram-budget", "1KiB"], "cannot hold the model"),
    (["--hardware", "gpu-scm-node"], "cuda node"),
    (["--data-dir", "."], "no Criteo files"),
    (["--input-time-per-sample", "fast"], "--input-time-per-sample: cannot read 'fast'"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, message) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(EXAMPLE_DLRM / "train.py"), *args, "--out", str(out)],
                          cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not out.exists() and os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- fast ----
ZIPF = {"pooling_factor": 8.0, "zipf_alpha": 0.9}
TABLES = [TableInfo("big", 2_000_000, 32), TableInfo("wide", 1_000_000, 32, ZIPF), TableInfo("small", 10_000, 32)]


def _place(hardware, budget: str, target_qps=None, storage="/tmp/x"):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                           feature_names=[f"f_{t.name}"]) for t in TABLES], device=torch.device("meta"))
    planner = make_planner(hardware, TABLES, 1, 512, parse_bytes(budget), storage, target_qps)
    check_fits(planner, ebc, budget)
    return planner


def test_planner_places_by_budget_and_bandwidth() -> None:
    planner = _place(load_hardware("local"), "64MiB")
    tiers = tier_of(planner)
    assert tiers["small"] == "DRAM" and not is_tiered(planner, "small")
    assert tiers["big"] == "SSD"  # cold: the SSD feeds it
    rows = placement_rows(planner)
    assert [r["table"] for r in rows] == ["big", "wide", "small"]
    everything = _place(load_hardware("local"), "4GiB")
    assert not any(is_tiered(everything, t.name) for t in TABLES)


def test_synthetic_tables_have_dlrm_datasets_working_sets_and_drift() -> None:
    from data import DEFAULT_TABLES, SyntheticData, calibration_samples

    # One dlrm_datasets batch (65,536 samples x 4 ids) of the 2M-row table touches
    # 262,144 / 6.9 ~ 38K rows; the small tables at most half their rows.
    t0 = DEFAULT_TABLES[0]
    assert t0.name == "t0_2m" and calibration_samples(t0) == 65_536
    still, moving = SyntheticData(DEFAULT_TABLES[:1], 512, 0), SyntheticData(DEFAULT_TABLES[:1], 512, 0, drift=0.2)
    assert 34_000 < still.unique_rows()["t0_2m"] < 42_000
    small = [t for t in DEFAULT_TABLES if t.num_rows == 10_000][0]
    assert SyntheticData([small], 512, 0).unique_rows()[small.name] <= 5_000
    ids = lambda d, step: set(d.batch(step, 0).sparse_features.values().tolist())
    assert ids(still, 0) <= set(still._samplers[0].rows.tolist())  # no drift: always the calibrated rows
    fresh = ids(moving, 10) - set(moving._samplers[0].rows.tolist())  # 10 steps at 0.2: all ranks moved twice
    assert len(fresh) > 0.9 * len(ids(moving, 10))
    assert ids(moving, 3) == ids(moving, 3)  # deterministic in (seed, step, rank)
    with pytest.raises(ValueError, match="drift=1.5"):
        SyntheticData(DEFAULT_TABLES[:1], 512, 0, drift=1.5)


def test_placement_errors_name_the_problem(tmp_path) -> None:
    only_dram = tmp_path / "dram.yaml"
    only_dram.write_text(
        "name: dram-only\ncompute_device: cpu\nranks_per_node: 1\n"
        "compute: {tbe_bandwidth: 1GB/s}\n"
        "tiers:\n  dram: {capacity: 64MiB, read_bandwidth: 5GB/s, write_bandwidth: 5GB/s}\n")
    with pytest.raises(ValueError, match="cannot hold the model.*no tier holds big"):
        _place(load_hardware(str(only_dram)), "64MiB")
    with pytest.raises(ValueError, match="cuda node"):
        load_hardware("gpu-scm-node")
    with pytest.raises(ValueError, match="--dram-budget must be > 0"):
        make_planner(load_hardware("local"), TABLES, 1, 512, 0, None)


def test_dram_budget_sizes_are_the_planners() -> None:
    # One size parser for profiles and flags: GB are powers of 1000, GiB of 1024; bare bytes.
    assert parse_bytes("1.5GB") == 1_500_000_000 and parse_bytes("1.5GiB") == 3 * 2**29
    assert parse_bytes("64MiB") == 64 * 2**20 and parse_bytes("4096") == 4096
    with pytest.raises(ValueError, match="--dram-budget: unknown unit 'Q'"):
        parse_bytes("64Q", "--dram-budget")


def test_auc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    scores = np.round(rng.standard_normal(300), 1)  # ties
    labels = (rng.random(300) < 0.4).astype(float)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size)
    assert auc(scores, labels) == pytest.approx(pairwise)
    assert np.isnan(auc(scores, np.zeros(300)))


def test_outputs_replace_the_directory_at_once(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    metrics = {"losses": [0.7, 0.6], "hit_rate": {"t": 0.9}, "placement": {"t": "SSD"}, "auc_curve": []}
    write_outputs(str(out), metrics, "summary")
    assert not (out / "stale.txt").exists() and _metrics(out)["losses"] == [0.7, 0.6]
    assert sorted(os.listdir(tmp_path)) == ["out"]
