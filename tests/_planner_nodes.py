"""A small CPU node with DRAM, SCM and SSD tiers, shared by the planner tests."""

from __future__ import annotations

from torchrec_mtrains import Tier
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

__all__ = ["CPU_NODE", "G"]

G = 1 << 30
CPU_NODE = TieredTopology(
    "test-cpu", "cpu", 2,
    {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9), Tier.SCM: TierSpec(16 * G, 2e9, 1e9),
     Tier.SSD: TierSpec(64 * G, 2e8, 3e8, 47_000, 90_000, 4096)},
    ComputeSpec(2e9, 0.002, 2e-7, 1e-6),
)
