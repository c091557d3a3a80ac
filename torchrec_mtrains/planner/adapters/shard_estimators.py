"""TorchRec ``ShardEstimator``s for tiered tables: the storage of each shard on every tier
(a ``TieredStorage``) and its ``Perf`` from our perf model (estimator.py).

Both split the whole table's figures by the shard's share of its rows (table-wise: all of
them; row-wise: 1/world each)."""

from __future__ import annotations

from typing import Dict, List, Optional

from torchrec.distributed.planner.types import (
    ParameterConstraints,
    Perf,
    ShardEstimator,
    ShardingOption,
    Topology,
)

from torchrec_mtrains.planner.adapters.enumerator import TieredShardingOption
from torchrec_mtrains.planner.adapters.tiered_storage import TieredStorage

__all__ = ["TieredStorageEstimator", "TieredPerfEstimator"]

_BWD_SHARE = 2.0 / 3.0  # backward (gradients + fused optimizer) ~ twice the forward, TorchRec's default multiplier


class TieredStorageEstimator(ShardEstimator):
    """Sets each shard's ``storage``: its rows on the table's tier, its cache in the compute tier."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None) -> None:
        self._topology = topology

    def estimate(self, sharding_options: List[ShardingOption], sharder_map=None) -> None:
        for option in _tiered(sharding_options):
            whole = TieredStorage.of(option.tier_bytes)
            for shard in option.shards:
                shard.storage = whole.scaled(option.shard_fraction(shard))


class TieredPerfEstimator(ShardEstimator):
    """Sets each shard's ``perf``: the table's embedding compute (TBE and cache work) as
    forward and backward, and its busiest tier's device time as ``prefetch_compute`` (the
    prefetch pipeline moves the rows while the previous step computes). No comms term: the
    perf model has no network."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None) -> None:
        self._topology = topology

    def estimate(self, sharding_options: List[ShardingOption], sharder_map=None) -> None:
        for option in _tiered(sharding_options):
            compute, io = option.cost.compute_s, max(option.cost.io_s.values(), default=0.0)
            for shard in option.shards:
                f = option.shard_fraction(shard)
                shard.perf = Perf(fwd_compute=compute * f * (1 - _BWD_SHARE), fwd_comms=0.0,
                                  bwd_compute=compute * f * _BWD_SHARE, bwd_comms=0.0, prefetch_compute=io * f)


def _tiered(options: List[ShardingOption]) -> List[TieredShardingOption]:
    for option in options:
        if not isinstance(option, TieredShardingOption):
            raise TypeError(f"{type(option).__name__} for {option.name}: the tiered estimators need the "
                            "TieredShardingOptions of TieredEnumerator")
    return options  # type: ignore[return-value]
