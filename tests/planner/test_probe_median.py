"""probe-hw --repeat: each figure of the written profile is the median of the probes, and
its note says how far apart they were."""

from __future__ import annotations

import dataclasses

import pytest

from torchrec_mtrains import Tier
from torchrec_mtrains.commands.probe_hw import combine
from torchrec_mtrains.planner.hardware.probe import ProbeResult
from torchrec_mtrains.planner.hardware.probe_median import median_topology, spread_notes
from torchrec_mtrains.planner.hardware.topology import parse_topology
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec


def topology(scale: float, iops: "float | None" = 1e5) -> TieredTopology:
    return TieredTopology(
        name="local", compute_device="cpu", ranks_per_node=2, cores_per_node=2, source="probe",
        tiers={Tier.DRAM: TierSpec(4e9, 3e9 * scale, 2e9),
               Tier.SSD: TierSpec(1e11, 4e8, 5e8 * scale, read_iops=iops, access_bytes=4096, miss_cpu_s=4e-6)},
        compute=ComputeSpec(tbe_bytes_per_s=1e10 * scale, step_overhead_s=1e-4, framework_step_s=0.02 * scale))


def test_each_figure_is_the_median_of_the_probes() -> None:
    topo = median_topology([topology(1.0), topology(3.0), topology(2.0)], source="medians")
    assert topo.tiers[Tier.DRAM].read_bytes_per_s == 6e9  # 3, 9, 6 GB/s
    assert topo.tiers[Tier.SSD].write_bytes_per_s == 1e9
    assert topo.compute.tbe_bytes_per_s == 2e10 and topo.compute.framework_step_s == 0.04
    # Figures every probe agrees on, and fields that are not figures, are kept as they were.
    assert topo.tiers[Tier.SSD].access_bytes == 4096 and isinstance(topo.tiers[Tier.SSD].access_bytes, int)
    assert topo.compute.step_overhead_s == 1e-4 and topo.tiers[Tier.DRAM].read_iops is None
    assert (topo.name, topo.ranks_per_node, topo.cores_per_node, topo.source) == ("local", 2, 2, "medians")


def test_an_even_count_takes_the_mean_of_the_middle_two() -> None:
    topo = median_topology([topology(1.0), topology(2.0)], source="")
    assert topo.compute.tbe_bytes_per_s == 1.5e10


def test_a_figure_missing_from_one_probe_is_left_out() -> None:
    topo = median_topology([topology(1.0), topology(1.0, iops=None)], source="")
    assert topo.tiers[Tier.SSD].read_iops is None


def test_probes_of_different_machines_are_refused() -> None:
    other = dataclasses.replace(topology(1.0), ranks_per_node=4)
    with pytest.raises(ValueError, match="different tiers or ranks per node"):
        median_topology([topology(1.0), other], source="")
    with pytest.raises(ValueError, match="at least one"):
        median_topology([], source="")


def test_notes_give_the_spread_of_each_figure_that_varied() -> None:
    notes = spread_notes([topology(1.0), topology(3.0), topology(2.0)])
    assert notes["tiers.dram.read_bandwidth"] == "median of 3 probes, max/min 3.00"
    assert notes["compute.tbe_bandwidth"] == "median of 3 probes, max/min 3.00"
    assert "tiers.ssd.read_iops" not in notes and "compute.step_overhead" not in notes


def test_the_combined_profile_loads_with_medians_and_spreads() -> None:
    results = [ProbeResult(topology(s), {"compute.tbe_bandwidth": "pooled lookups"}, "header")
               for s in (1.0, 4.0, 2.0)]
    combined = combine(results)
    text = combined.to_yaml()
    loaded = parse_topology(text)
    assert loaded.compute.tbe_bytes_per_s == 2e10
    assert "pooled lookups; median of 3 probes, max/min 4.00" in text
    assert "median of 3 probes run one after another" in text
