"""Placement of embedding tables on tiers: the hardware (topology) and, later, the planner."""

# -- topology (hardware profiles): issue 5 / probe-hw
from torchrec_mtrains.planner.topology import load_topology
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

__all__ = [
    # topology
    "ComputeSpec",
    "TierSpec",
    "TieredTopology",
    "load_topology",
]
