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

# What a user imports from here (pinned by tests/package/test_package.py). The adapters to
# TorchRec's planner interfaces and the model's parts stay importable from here and from
# their modules.
__all__ = [
    "ComputeSpec",
    "ModelSpec",
    "Placement",
    "PlacementError",
    "StorageAwarePlanner",
    "TierSpec",
    "TieredTopology",
    "load_model_spec",
    "load_topology",
    "place",
    "size_cluster",
]
