"""Storage-aware planning, by job: ``hardware`` (profiles, units, probing a machine),
``model`` (the model spec, locality and perf models, placement of tables on tiers, cluster
sizing), ``adapters`` (the placement behind TorchRec's planner interfaces: TieredStorage,
TieredEnumerator, the tiered shard estimators, TieredProposer, TieredPartitioner), and on
top StorageAwarePlanner, a drop-in for TorchRec's EmbeddingShardingPlanner."""

from torchrec_mtrains.planner.adapters import (
    TieredEnumerator,
    TieredPartitioner,
    TieredPerfEstimator,
    TieredProposer,
    TieredShardingOption,
    TieredStorage,
    TieredStorageEstimator,
    torchrec_topology,
)
from torchrec_mtrains.planner.hardware import load_topology
from torchrec_mtrains.planner.model import (
    ModelSpec,
    ModelTable,
    Placement,
    PlacementError,
    load_model_spec,
    parse_model_spec,
    place,
    size_cluster,
)
from torchrec_mtrains.planner.planner import StorageAwarePlanner
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
