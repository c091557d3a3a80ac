"""Storage-aware planning: hardware profiles, the locality and perf models, placement of
tables on tiers, cluster sizing, and StorageAwarePlanner (a drop-in for TorchRec's
EmbeddingShardingPlanner, built on its planner interfaces: TieredStorage, TieredEnumerator,
the tiered shard estimators, TieredProposer, TieredPartitioner)."""

from torchrec_mtrains.planner.enumerator import TieredEnumerator, TieredShardingOption
from torchrec_mtrains.planner.model_spec import (
    ModelSpec,
    ModelTable,
    load_model_spec,
    parse_model_spec,
)
from torchrec_mtrains.planner.partitioner import TieredPartitioner
from torchrec_mtrains.planner.placement import Placement, PlacementError, place
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.planner.proposer import TieredProposer
from torchrec_mtrains.planner.shard_estimators import TieredPerfEstimator, TieredStorageEstimator
from torchrec_mtrains.planner.sizing import size_cluster
from torchrec_mtrains.planner.tiered_storage import TieredStorage, torchrec_topology
from torchrec_mtrains.planner.topology import load_topology
from torchrec_mtrains.planner.types import (
    ComputeSpec,
    RankAssignment,
    TablePlacement,
    TieredTopology,
    TierSpec,
)

__all__ = [
    "ComputeSpec",
    "ModelSpec",
    "ModelTable",
    "Placement",
    "PlacementError",
    "RankAssignment",
    "StorageAwarePlanner",
    "TablePlacement",
    "TieredEnumerator",
    "TieredPartitioner",
    "TieredPerfEstimator",
    "TieredProposer",
    "TieredShardingOption",
    "TieredStorage",
    "TieredStorageEstimator",
    "TierSpec",
    "TieredTopology",
    "load_model_spec",
    "load_topology",
    "parse_model_spec",
    "place",
    "size_cluster",
    "torchrec_topology",
]
