"""Hardware profiles: the YAML schema, units, errors, round trip, shipped profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from torchrec_mtrains import Tier
from torchrec_mtrains.planner import ComputeSpec, TieredTopology, TierSpec, load_topology
from torchrec_mtrains.planner.hardware.topology import parse_topology, shipped_profiles, topology_to_yaml
from torchrec_mtrains.planner.hardware.units import format_quantity, parse_quantity, parse_size

GiB, GB = 2**30, 1e9

CPU_DOC = """
name: box
source: test
compute_device: cpu
ranks_per_node: 2
compute:
  tbe_bandwidth: 2.5GB/s
  step_overhead: 0.5ms
  cache_row_cost: 120ns
  dense_time_per_sample: 3us
tiers:
  dram: {capacity: 8GiB, read_bandwidth: 10GB/s, write_bandwidth: 8000MB/s}
  scm: {capacity: 1TB, read_bandwidth: 2GiB/s, write_bandwidth: 1GiB/s, access_size: 256B}
  ssd:
    capacity: 1.5TiB
    read_bandwidth: 2.0GB/s
    write_bandwidth: 1GB/s
    read_iops: 500K
    write_iops: 1.2M/s
    access_size: 4KiB
"""


def _doc(**changes: object) -> str:
    """CPU_DOC with dotted paths set (None deletes)."""
    doc = yaml.safe_load(CPU_DOC)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return yaml.safe_dump(doc)


def test_parses_every_field_with_units() -> None:
    t = parse_topology(CPU_DOC)
    assert (t.name, t.source, t.compute_device, t.ranks_per_node) == ("box", "test", "cpu", 2)
    assert t.host_device_bytes_per_s is None
    assert t.compute == ComputeSpec(tbe_bytes_per_s=2.5e9, step_overhead_s=5e-4, cache_row_s=pytest.approx(120e-9),
                                    dense_s_per_sample=pytest.approx(3e-6))
    assert list(t.tiers) == [Tier.DRAM, Tier.SCM, Tier.SSD]
    assert t.tiers[Tier.DRAM] == TierSpec(8 * GiB, 10 * GB, 8 * GB)
    assert t.tiers[Tier.SCM] == TierSpec(1e12, 2 * GiB, GiB, access_bytes=256)
    assert t.tiers[Tier.SSD] == TierSpec(1.5 * 2**40, 2e9, 1e9, read_iops=5e5, write_iops=1.2e6, access_bytes=4096)
    assert isinstance(t.tiers[Tier.SSD].access_bytes, int)
    assert t.cache_tier() is Tier.DRAM


def test_unit_in_key_names() -> None:
    doc = _doc(tiers__dram={"capacity_bytes": 1024, "read_bytes_per_s": 1e9, "write_bytes_per_s": 5e8,
                            "access_bytes": 64},
               compute={"tbe_bytes_per_s": 3e9, "step_overhead_s": 0.001})
    t = parse_topology(doc)
    assert t.tiers[Tier.DRAM] == TierSpec(1024, 1e9, 5e8, access_bytes=64)
    assert t.compute == ComputeSpec(3e9, 0.001)


@pytest.mark.parametrize("text,kind,want", [
    ("64B", "size", 64), ("1KB", "size", 1e3), ("1KiB", "size", 1024), ("2MiB", "size", 2 * 2**20),
    ("3MB", "size", 3e6), ("512GiB", "size", 512 * GiB), ("1.5TB", "size", 1.5e12), ("1TiB", "size", 2**40),
    ("2.0GB/s", "bandwidth", 2e9), ("400MiB/s", "bandwidth", 400 * 2**20), ("1e3 B/s", "bandwidth", 1e3),
    ("500K", "count_rate", 5e5), ("1.5M/s", "count_rate", 1.5e6), ("12000", "count_rate", 12000),
    (12000, "count_rate", 12000), ("2G", "count_rate", 2e9),
    ("0.5ms", "time", 5e-4), ("120ns", "time", 120e-9), ("3us", "time", 3e-6), ("2s", "time", 2.0),
])
def test_units(text: object, kind: str, want: float) -> None:
    assert parse_quantity(text, kind, "x") == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("text,kind,match", [
    ("512", "size", "no unit"), (512, "size", "no unit"), ("5XB", "size", "unknown unit 'XB'"),
    ("2GB", "bandwidth", "lacks '/s'"), ("2GB/s", "size", "has no '/s'"), ("-1GB", "size", "negative"),
    ("fast", "bandwidth", "cannot read"), ("5 kb", "size", "unknown unit 'kb'"), (True, "size", "expected"),
    ("1ks", "time", "unknown unit"), ("nanGB", "size", "cannot read"), ([1], "size", "expected"),
    ("1e999GB", "size", "not finite"), ("3P", "count_rate", "unknown unit 'P'"),
])
def test_bad_units(text: object, kind: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        parse_quantity(text, kind, "tiers.ssd.capacity")
    assert str(e.value).startswith("tiers.ssd.capacity: ")


def test_parse_size_is_si_or_iec_as_written() -> None:
    assert parse_size("1.5GB", "x") == 1.5e9 and parse_size("1.5GiB", "x") == 1.5 * GiB
    assert parse_size("64MiB", "--flag", bare_bytes=True) == 64 * 2**20
    assert parse_size("4096", "--flag", bare_bytes=True) == parse_size(4096, "--flag", bare_bytes=True) == 4096
    with pytest.raises(ValueError, match="^tiers.dram.capacity: '4096' has no unit"):
        parse_size("4096", "tiers.dram.capacity")  # a profile's sizes need their unit
    with pytest.raises(ValueError, match="^--dram-budget: unknown unit 'm' in '64m'"):
        parse_size("64m", "--dram-budget", bare_bytes=True)


@pytest.mark.parametrize("changes,path", [
    ({"tiers__ssd__read_bandwidth": "2GB"}, "tiers.ssd.read_bandwidth"),
    ({"tiers__ssd__read_bandwidth": None}, "tiers.ssd.read_bandwidth: missing"),
    ({"tiers__ssd__capacity": None}, "tiers.ssd.capacity: missing"),
    ({"tiers__ssd__capacity": "-5GB"}, "tiers.ssd.capacity: '-5GB' is negative"),
    ({"tiers__ssd__capacity": "0B"}, "tiers.ssd.capacity: must be > 0"),
    ({"tiers__ssd__capacity_bytes": -1, "tiers__ssd__capacity": None}, "tiers.ssd.capacity_bytes: -1.0 must be"),
    ({"tiers__ssd__capacity_bytes": 10}, "tiers.ssd.capacity: given twice"),
    ({"tiers__ssd__capacity_bytes": "1GB", "tiers__ssd__capacity": None}, "tiers.ssd.capacity_bytes: the unit is in the key"),
    ({"tiers__ssd__latency": "1us"}, "tiers.ssd.latency: unknown key"),
    ({"tiers__ssd__access_size": "1.5B"}, "tiers.ssd.access_size: must be a whole number"),
    ({"tiers__ssd__read_iops": "5X"}, "tiers.ssd.read_iops: unknown unit"),
    ({"tiers__nvm": {"capacity": "1GB"}}, "tiers.nvm: unknown tier"),
    ({"tiers__ssd": "fast"}, "tiers.ssd: must be a mapping"),
    ({"tiers__dram": None}, "tiers.dram: missing"),
    ({"tiers": {}}, "tiers: at least one tier"),
    ({"tiers": None}, "tiers: missing"),
    ({"compute": None}, "compute: missing"),
    ({"compute__tbe_bandwidth": None}, "compute.tbe_bandwidth: missing"),
    ({"compute__step_overhead": "1GB/s"}, "compute.step_overhead: unknown unit 'GB'"),
    ({"compute__step_overhead": "-1ms"}, "compute.step_overhead: '-1ms' is negative"),
    ({"compute__warp": 3}, "compute.warp: unknown key"),
    ({"compute_device": "tpu"}, "compute_device: 'tpu' must be one of"),
    ({"compute_device": None}, "compute_device: missing"),
    ({"ranks_per_node": 0}, "ranks_per_node: 0 must be an integer >= 1"),
    ({"ranks_per_node": 1.5}, "ranks_per_node: 1.5"),
    ({"name": ""}, "name: must be a non-empty string"),
    ({"nodes": 4}, "nodes: unknown key"),
    ({"host_device_bandwidth": "25GB/s"}, "host_device_bandwidth: only for compute_device cuda"),
    ({"tiers__hbm": {"capacity": "8GB", "read_bandwidth": "1TB/s", "write_bandwidth": "1TB/s"}}, "tiers.hbm: a cpu node"),
    ({"compute_device": "cuda", "host_device_bandwidth": "25GB/s"}, "tiers.hbm: missing"),
    ({"compute_device": "cuda", "tiers__hbm": {"capacity": "8GB", "read_bandwidth": "1TB/s", "write_bandwidth": "1TB/s"}},
     "host_device_bandwidth: missing"),
])
def test_bad_documents_name_the_field(changes: dict, path: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_topology(_doc(**changes))
    assert str(e.value).startswith(path), str(e.value)


def test_not_yaml_or_not_a_mapping() -> None:
    with pytest.raises(ValueError, match="not valid YAML"):
        parse_topology("tiers: [unclosed")
    with pytest.raises(ValueError, match="must be a mapping"):
        parse_topology("- a list")


def test_round_trip() -> None:
    t = parse_topology(CPU_DOC)
    text = topology_to_yaml(t, notes={"tiers.ssd.read_iops": "fio says more"}, header="measured\nby hand")
    assert text.startswith("# measured\n# by hand\n")
    assert "read_iops: 500K  # fio says more" in text
    assert "capacity: 8GiB" in text and "read_bandwidth: 2GB/s" in text
    assert parse_topology(text) == t
    # awkward values survive exactly
    odd = TieredTopology(
        name="odd: name", compute_device="cuda", ranks_per_node=3,
        tiers={Tier.HBM: TierSpec(1e10 / 3, 1234567.891, 1.0, read_iops=1 / 3, access_bytes=96)},
        compute=ComputeSpec(math.pi * 1e9, 1e-7 / 3, 0.0, 1.2e-7), host_device_bytes_per_s=2.5e10,
        source="#1 with 'quotes'")
    assert parse_topology(topology_to_yaml(odd)) == odd


def test_notes_must_name_fields() -> None:
    with pytest.raises(ValueError, match="tiers.hbm.capacity"):
        topology_to_yaml(parse_topology(CPU_DOC), notes={"tiers.hbm.capacity": "x"})


@pytest.mark.parametrize("value,kind,text", [
    (2**39, "size", "512GiB"), (1e12, "size", "1TB"), (64, "size", "64B"), (2.5e9, "bandwidth", "2.5GB/s"),
    (5e5, "count_rate", "500K"), (5e-4, "time", "500us"), (0.0, "time", "0s"),
])
def test_format(value: float, kind: str, text: str) -> None:
    assert format_quantity(value, kind) == text
    assert parse_quantity(text, kind, "x") == value


def test_load_by_path_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "node.yaml"
    p.write_text(_doc(name=None))
    t = load_topology(p)
    assert t.name == "node"  # the file's stem when the document has no name
    assert load_topology(str(p)) == t
    with pytest.raises(FileNotFoundError, match="not a shipped profile.*gpu-scm-node"):
        load_topology("no-such-profile")
    with pytest.raises(FileNotFoundError):
        load_topology(tmp_path / "missing.yaml")
    p.write_text(_doc(tiers__ssd__capacity="lots"))
    with pytest.raises(ValueError, match=r"node\.yaml: tiers\.ssd\.capacity: cannot read 'lots'"):
        load_topology(p)


@pytest.mark.parametrize("name", ["gpu-scm-node", "local"])
def test_shipped_profiles_load_and_are_sane(name: str) -> None:
    assert name in shipped_profiles()
    t = load_topology(name)
    assert t.name == name and t.source
    assert t.cache_tier() in t.tiers
    # faster tiers first: bandwidth falls down the hierarchy (on spec sheets; measured here,
    # the mmap "SCM" of the page cache can outrun the DRAM store's gather)
    specs = list(t.tiers.values())
    for hi, lo in zip(specs, specs[1:]):
        assert hi.read_bytes_per_s >= lo.read_bytes_per_s or name == "local"
    assert t.compute.tbe_bytes_per_s > 0
    assert parse_topology(topology_to_yaml(t)) == t


def test_gpu_scm_node_figures() -> None:
    gpu = load_topology("gpu-scm-node")
    assert gpu.compute_device == "cuda" and gpu.ranks_per_node == 8
    assert set(gpu.tiers) == set(Tier)
    assert gpu.tiers[Tier.HBM].capacity_bytes == 80 * GiB
    assert 1e12 < gpu.tiers[Tier.HBM].read_bytes_per_s < 4e12
    assert gpu.tiers[Tier.SSD].access_bytes == 4096 and gpu.tiers[Tier.SSD].read_iops
    # random-row bandwidth of a block tier = IOPS x block
    ssd = gpu.tiers[Tier.SSD]
    assert ssd.read_bytes_per_s == pytest.approx(ssd.read_iops * ssd.access_bytes)
    assert 10e9 < gpu.host_device_bytes_per_s < 32e9


def test_local_profile_is_this_machine() -> None:
    local = load_topology("local")
    assert local.compute_device == "cpu" and local.ranks_per_node == 2
    assert set(local.tiers) == {Tier.DRAM, Tier.SCM, Tier.SSD}
    assert local.tiers[Tier.DRAM].capacity_bytes < 24 * GiB / 2  # per rank of a 24 GiB node
    assert "mtrains probe-hw" in local.source and "measured" in local.source
    assert local.compute.tbe_bytes_per_s > 0 and local.compute.dense_s_per_sample > 0
