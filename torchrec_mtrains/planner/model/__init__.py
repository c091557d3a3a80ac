"""The planner's models: the model a plan is for (MODEL.yaml), each table's locality, the
perf model, the placement of tables on tiers, and cluster sizing."""

from torchrec_mtrains.planner.model.estimator import TableCost, kernel_step_seconds, step_seconds, table_cost
from torchrec_mtrains.planner.model.locality import LocalityCurve, histogram_locality, zipf_locality
from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable, load_model_spec, parse_model_spec
from torchrec_mtrains.planner.model.placement import Placement, PlacementError, PlacementMemo, place, tier_bytes
from torchrec_mtrains.planner.model.sizing import plan_report, size_cluster

__all__ = [
    "LocalityCurve",
    "ModelSpec",
    "ModelTable",
    "Placement",
    "PlacementError",
    "PlacementMemo",
    "TableCost",
    "histogram_locality",
    "load_model_spec",
    "parse_model_spec",
    "place",
    "plan_report",
    "size_cluster",
    "kernel_step_seconds",
    "step_seconds",
    "table_cost",
    "tier_bytes",
    "zipf_locality",
]
