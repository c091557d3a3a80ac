"""TieredStorage: TorchRec's planner ``Storage`` with the SCM tier, and the TorchRec
``Topology`` of a job whose devices carry it.

TorchRec's ``Storage`` has hbm, ddr and ssd, and its arithmetic (``__add__``, ``__sub__``)
builds a plain ``Storage(hbm, ddr, ssd)`` and ``fits_in`` compares those three only,
dropping any other field: a fourth tier needs a type of its own, used by our estimators and
partitioner.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from torchrec.distributed.planner.types import KernelConfig, Storage, Topology, TopologyFactory, TrainerConfig

from torchrec_mtrains.planner.types import TieredTopology
from torchrec_mtrains.types import Tier

__all__ = ["TieredStorage", "STORAGE_FIELD", "torchrec_topology"]

STORAGE_FIELD = {Tier.HBM: "hbm", Tier.DRAM: "ddr", Tier.SCM: "scm", Tier.SSD: "ssd"}


@dataclasses.dataclass(repr=True, order=True, eq=True)
class TieredStorage(Storage):
    """Bytes on each tier: hbm, ddr (host DRAM), ssd and scm."""

    scm: int = 0

    @classmethod
    def of(cls, tier_bytes: Mapping[Tier, float]) -> "TieredStorage":
        fields = {f: 0 for f in STORAGE_FIELD.values()}
        for tier, b in tier_bytes.items():
            fields[STORAGE_FIELD[tier]] += int(round(b))
        return cls(**fields)

    @classmethod
    def of_storage(cls, storage: Storage) -> "TieredStorage":
        """Any TorchRec ``Storage`` as a TieredStorage (no SCM bytes if it has none)."""
        return cls.of({tier: _on(storage, tier) for tier in STORAGE_FIELD})

    def on(self, tier: Tier) -> int:
        return getattr(self, STORAGE_FIELD[tier])

    def scaled(self, fraction: float) -> "TieredStorage":
        return TieredStorage.of({tier: self.on(tier) * fraction for tier in STORAGE_FIELD})

    def __add__(self, other: Storage) -> "TieredStorage":
        return TieredStorage.of({t: self.on(t) + _on(other, t) for t in STORAGE_FIELD})

    def __sub__(self, other: Storage) -> "TieredStorage":
        return TieredStorage.of({t: self.on(t) - _on(other, t) for t in STORAGE_FIELD})

    def __hash__(self) -> int:
        return hash((self.hbm, self.ddr, self.ssd, self.scm))

    def fits_in(self, other: Storage) -> bool:
        return all(self.on(t) <= _on(other, t) for t in STORAGE_FIELD)


def _on(storage: Storage, tier: Tier) -> int:
    return getattr(storage, STORAGE_FIELD[tier], 0)


def torchrec_topology(topo: TieredTopology, world_size: int, capacity_bytes: Mapping[Tier, float]) -> Topology:
    """TorchRec's ``Topology`` of ``world_size`` ranks of ``topo``: each device's storage is
    a ``TieredStorage`` holding the rank's share of ``capacity_bytes`` (the job's bytes per
    tier, budgets applied)."""
    share = TieredStorage.of({tier: b / world_size for tier, b in capacity_bytes.items()})
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, local_world_size=min(world_size, topo.ranks_per_node),
                      hbm_cap_bytes=share.hbm, ddr_cap_bytes=share.ddr, ssd_cap_bytes=share.ssd),
        kernel_config=KernelConfig(compute_device=topo.compute_device),
    )
    for device in topology.devices:
        device.storage = share
    return topology
