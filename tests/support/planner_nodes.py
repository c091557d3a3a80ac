"""A small CPU node with DRAM, SCM and SSD tiers, shared by the planner tests, and a frozen
hardware profile for the example runs whose tests need given placements."""

from __future__ import annotations

from tests.support.paths import TEST_PROFILES
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

__all__ = ["CPU_NODE", "G", "PINNED_PROFILE"]

G = 1 << 30
CPU_NODE = TieredTopology(
    "test-cpu", "cpu", 2,
    {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9), Tier.SCM: TierSpec(16 * G, 2e9, 1e9),
     Tier.SSD: TierSpec(64 * G, 2e8, 3e8, 47_000, 90_000, 4096)},
    ComputeSpec(2e9, 0.002, 2e-7, 1e-6),
)


# A hardware profile frozen for tests whose scenario needs given placements (a table on SCM,
# two on SSD, ...): the shipped ``local`` profile is re-measured from time to time and its
# figures move the planner's choices.
PINNED_PROFILE = str(TEST_PROFILES / "two_core_vm.yaml")
