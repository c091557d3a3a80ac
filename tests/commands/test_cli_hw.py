"""``mtrains probe-hw`` and ``mtrains characterize``: output, files, bad input (exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.cli import main
from torchrec_mtrains.planner import load_topology
from torchrec_mtrains.stats import SyntheticTable, generate_dlrm_batch, write_dlrm_file

TABLES = [SyntheticTable(2000, 3.0, zipf_alpha=1.1), SyntheticTable(500, 1.0, zipf_alpha=0.8)]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.pt.gz"
    write_dlrm_file(path, generate_dlrm_batch(TABLES, batch_size=2048, seed=3))
    return path


@pytest.mark.slow
def test_probe_hw_quick_writes_a_loadable_profile(tmp_path: Path) -> None:
    out = tmp_path / "hw.yaml"
    assert main(["probe-hw", "--quick", "--table-size", "24MiB", "--dir", str(tmp_path), "--out", str(out)]) == 0
    topo = load_topology(out)
    assert topo.name == "local" and topo.compute_device == "cpu" and topo.ranks_per_node == 2
    assert set(topo.tiers) == {Tier.DRAM, Tier.SCM, Tier.SSD}
    for spec in topo.tiers.values():
        assert spec.capacity_bytes > 0 and spec.read_bytes_per_s > 0 and spec.write_bytes_per_s > 0
    assert topo.tiers[Tier.SSD].read_iops and topo.tiers[Tier.SSD].access_bytes == 4096
    # The kernel's row path per row loaded and written back, measured on SCM and SSD: an SSD
    # load (a block read through the kernel's I/O path) costs more CPU than an SCM one.
    for tier in (Tier.SCM, Tier.SSD):
        assert topo.tiers[tier].miss_cpu_s > 0 and topo.tiers[tier].write_back_cpu_s > 0
    assert topo.tiers[Tier.SSD].miss_cpu_s > topo.tiers[Tier.SCM].miss_cpu_s
    assert topo.compute.tbe_bytes_per_s > 0 and topo.compute.dense_s_per_sample > 0
    # The tiered kernel's own cost, a dense layer's and the framework's, and the cores.
    assert topo.compute.step_overhead_s > 0 and topo.compute.framework_step_s > 0
    assert topo.compute.dense_mac_s > 0 or topo.compute.dense_activation_s > 0
    assert topo.cores_per_node == os.cpu_count()
    for key in ("lookup_cost", "step_background_cpu", "lookup_background_cpu", "dense_mac_cost",
                "dense_activation_cost", "dense_layer_cost", "framework_step_cost", "framework_table_cost",
                "framework_table_sample_cost", "framework_output_byte_cost", "cores_per_node"):
        assert f"{key}:" in out.read_text()
    assert "probe-hw --quick" in topo.source
    text = out.read_text()
    assert "PER RANK" in text and "# DramStore.read" in text
    assert "fully written 24 MiB table" in text  # --table-size sized the tier probes' tables
    assert "miss_cpu_cost:" in text and "cache_stats' stage CPU" in text
    assert list(tmp_path.iterdir()) == [out]  # scratch files removed


@pytest.mark.parametrize("argv,message", [
    (["--dir", "/no/such/dir"], "is not a directory"),
    (["--ranks-per-node", "0"], "ranks_per_node=0"),
    (["--out", "/no/such/dir/x.yaml"], "does not exist"),
    (["--frobnicate"], "unrecognized arguments"),
    (["--table-size", "5Q"], "--table-size: unknown unit 'Q'"),
    (["--table-size", "1MiB"], "table_mib=1 must be an integer >= 16"),
    (["--repeat", "0"], "--repeat 0: must be >= 1"),
])
def test_probe_hw_bad_arguments_exit_2(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["probe-hw", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_characterize_prints_a_table(trace: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["characterize", str(trace), "--batch-size", "256", "--num-rows", "2000,500"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["table", "rows", "lookups", "unique", "pool"]
    assert out[2].startswith("table_0") and out[3].startswith("table_1")
    assert "2,000" in out[2] and "500" in out[3]
    assert "100,000 samples/s" in out[-1]


def test_characterize_json_matches_the_stats(trace: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["characterize", str(trace), "--batch-size", "256", "--json", "--qps", "1000", "--dim", "3",
                 "--tables", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["qps"] == 1000 and doc["batch_size"] == 256
    (t,) = doc["tables"]
    assert t["table"] == "table_0" and t["steps"] == 8 and not t["rows_known"]
    assert t["lookups"] == pytest.approx(2048 * 3.0, rel=0.1)
    assert t["pooling_factor"] == pytest.approx(t["lookups"] / 2048)
    lru = [t["hit_rate"]["lru"][k] for k in ("0.01", "0.05", "0.1", "0.2")]
    assert lru == sorted(lru) and 0 <= lru[0] and lru[-1] <= 1
    assert t["lookup_bytes_per_s"] == pytest.approx(1000 * t["pooling_factor"] * 16)
    miss = 1 - t["hit_rate"]["lru"]["0.1"]
    assert t["tier_bytes_per_s_at_10pct_lru"] == pytest.approx(1000 / 256 * t["unique_rows_per_step"] * miss * 16)
    assert sum(t["reuse"]["shares"]) == pytest.approx(1.0)


@pytest.mark.slow
def test_characterize_plots(trace: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    assert main(["characterize", str(trace), "--plot", str(plots)]) == 0
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["bandwidth.png", "hit_rate_curves.png", "reuse_histogram.png"]
    for p in plots.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bad_trace(tmp_path: Path, obj: object, name: str = "bad.pt") -> str:
    path = tmp_path / name
    torch.save(obj, path)
    return str(path)


@pytest.mark.parametrize("make,extra,message", [
    (lambda p: str(p / "missing.pt"), [], "no such file"),
    (lambda p: (p / "junk.pt").write_bytes(b"not a torch file") and str(p / "junk.pt"), [], "not a dlrm_datasets trace"),
    (lambda p: _bad_trace(p, {"a": 1}), [], "expected a tuple (indices, offsets, lengths)"),
    (lambda p: _bad_trace(p, (torch.tensor([0, 1]), torch.tensor([0, 1, 3]), torch.tensor([[1, 1]]))), [],
     "offsets"),
    (lambda p: _bad_trace(p, (torch.tensor([-1]), torch.tensor([0, 1]), torch.tensor([[1]]))), [], "indices"),
    (None, ["--batch-size", "0"], "--batch-size 0"),
    (None, ["--qps", "-5"], "--qps"),
    (None, ["--tables", "7"], "--tables: '7' is outside"),
    (None, ["--tables", "x"], "--tables: 'x'"),
    (None, ["--num-rows", "5,6,7"], "--num-rows"),
    (None, ["--num-rows", "10"], "outside num_rows=10"),
    (None, ["--sample-rate", "2"], "sample_rate=2.0"),
])
def test_characterize_bad_input_exits_2(make, extra: list, message: str, trace: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    path = str(trace) if make is None else make(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["characterize", path, *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_characterize_one_cold_step_has_no_hits(trace: Path, capsys: pytest.CaptureFixture) -> None:
    # the default batch (4096) exceeds the file's 2048 samples: one step, every access a miss
    assert main(["characterize", str(trace), "--json"]) == 0
    for t in json.loads(capsys.readouterr().out)["tables"]:
        assert t["steps"] == 1
        assert all(v == 0 for policy in t["hit_rate"].values() for v in policy.values())
