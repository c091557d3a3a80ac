"""Storage-aware planning: hardware profiles, the locality and perf models, placement of
tables on tiers, cluster sizing, and StorageAwarePlanner (a drop-in for TorchRec's
EmbeddingShardingPlanner)."""

from torchrec_mtrains.planner.model_spec import (
    ModelSpec,
    ModelTable,
    load_model_spec,
    parse_model_spec,
)
from torchrec_mtrains.planner.placement import Placement, PlacementError, place
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.planner.sizing import size_cluster
from torchrec_mtrains.planner.topology import load_topology
from torchrec_mtrains.planner.types import (
    ComputeSpec,
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
    "StorageAwarePlanner",
    "TablePlacement",
    "TierSpec",
    "TieredTopology",
    "load_model_spec",
    "load_topology",
    "parse_model_spec",
    "place",
    "size_cluster",
]
