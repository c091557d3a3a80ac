"""The placement behind TorchRec's planner interfaces: ``TieredStorage`` (TorchRec's
``Storage`` plus SCM), ``TieredEnumerator``, the tiered shard estimators, ``TieredProposer``
and ``TieredPartitioner``."""

from torchrec_mtrains.planner.adapters.enumerator import TieredEnumerator, TieredShardingOption
from torchrec_mtrains.planner.adapters.partitioner import TieredPartitioner
from torchrec_mtrains.planner.adapters.proposer import TieredProposer
from torchrec_mtrains.planner.adapters.shard_estimators import TieredPerfEstimator, TieredStorageEstimator
from torchrec_mtrains.planner.adapters.tiered_storage import TieredStorage, torchrec_topology

__all__ = [
    "TieredEnumerator",
    "TieredPartitioner",
    "TieredPerfEstimator",
    "TieredProposer",
    "TieredShardingOption",
    "TieredStorage",
    "TieredStorageEstimator",
    "torchrec_topology",
]
