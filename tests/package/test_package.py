"""The package imports cheaply and the `mtrains` console script dispatches."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchrec_mtrains
from tests.support.paths import DOCS
from torchrec_mtrains import Tier

# The console script installed next to the interpreter running the tests (.venv/bin).
MTRAINS = Path(sys.executable).with_name("mtrains")


def test_public_surface() -> None:
    assert torchrec_mtrains.__all__ == ["Tier", "__version__"]
    assert torchrec_mtrains.__version__ == "0.1.0"
    assert [t.name for t in Tier] == ["HBM", "DRAM", "SCM", "SSD"]


# What a user imports from each subpackage (docs/architecture.md, "Public API contract").
# Changing one of these lists is changing the public API: the docs change with it.
PUBLIC = {
    "storage": ["BlockStore", "CorruptionError", "DramStore", "RowStore", "ScmStore", "StoreRuntimeConfig",
                "TableConfig", "lazy_init_rows"],
    "kernels": ["DEFAULT_CACHE_LOAD_FACTOR", "EvictionSpec", "TieredConfig", "TieredEmbeddingBags", "VirtualTableFull",
                "VirtualTableSpec"],
    "sharding": ["ShardedTieredEmbeddingBagCollection", "ShardedTieredEmbeddingCollection",
                 "TieredEmbeddingBagCollectionSharder", "TieredEmbeddingCollectionSharder",
                 "TieredParameterSharding", "TieredParams", "TieredTrainPipeline", "tiered_sharding_plan"],
    "checkpoint": ["ChainError", "CheckpointRecord", "DifferentialCheckpointer", "PendingSave",
                   "export_full_checkpoint", "flush_tiers", "latest_checkpoint"],
    "planner": ["ComputeSpec", "ModelSpec", "Placement", "PlacementError", "StorageAwarePlanner", "TierSpec",
                "TieredTopology", "load_model_spec", "load_topology", "place", "size_cluster"],
    "stats": ["DLRM_DATASETS_LOOKUP_SHARES", "DLRM_DATASETS_ROW_SHARES", "CurveCacheStatistics", "HitRateCurve",
              "ReuseHistogram", "SyntheticTable", "TableStats", "TableTrace", "Trace", "analyze_table",
              "analyze_trace", "generate_dlrm_batch", "lfu_curve", "load_dlrm_trace", "lru_curve",
              "reuse_histogram", "trace_from_dlrm_batches", "trace_from_kjts"],
    "testing": ["PHASES", "enable_device_faults", "fault_point", "inject_device_fault"],
}
# Names that left __all__ and must stay importable from the subpackage (users had them).
KEPT_IMPORTABLE = {
    "sharding": ["TieredBatchedEmbeddingBag", "TieredFusedOptimizer"],
    "checkpoint": ["exclude_tiered_state", "read_chain", "remove_leftovers"],
    "planner": ["ModelTable", "RankAssignment", "TablePlacement", "TieredEnumerator", "TieredPartitioner",
                "TieredPerfEstimator", "TieredProposer", "TieredShardingOption", "TieredStorage",
                "TieredStorageEstimator", "parse_model_spec", "torchrec_topology"],
    "stats": ["DLRM_DATASETS_REUSE", "REUSE_BIN_EDGES", "REUSE_BIN_EDGES_16", "DlrmBatch", "bin_edges_for",
              "bin_mean_reuse", "check_dlrm_batch", "check_reuse_shares", "drifted_ids", "drifted_positions",
              "fit_zipf_alpha", "lookups_per_unique_row", "read_dlrm_file", "replay_cache_hit_rate", "rows_per_bin",
              "shards_mask", "stack_distances", "step_accesses", "write_dlrm_file"],
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_subpackage_exports_its_pinned_api(name: str) -> None:
    module = importlib.import_module(f"torchrec_mtrains.{name}")
    assert sorted(module.__all__) == sorted(PUBLIC[name])
    assert all(hasattr(module, n) for n in module.__all__)
    assert all(hasattr(module, n) for n in KEPT_IMPORTABLE.get(name, []))


def test_the_architecture_doc_lists_every_public_name() -> None:
    contract = (DOCS / "architecture.md").read_text()
    contract = contract[contract.index("## Public API contract"):]
    missing = [f"{pkg}.{n}" for pkg, names in PUBLIC.items() for n in names if f"`{n}`" not in contract]
    assert missing == []


def _mtrains(*args: str) -> subprocess.CompletedProcess[str]:
    assert MTRAINS.exists(), f"{MTRAINS} missing: run scripts/setup.sh"
    return subprocess.run([str(MTRAINS), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"]])
def test_help_exits_zero(args: list[str]) -> None:
    result = _mtrains(*args)
    assert result.returncode == 0, result.stderr
    assert "usage: mtrains" in result.stdout


def test_bench_help_lists_store() -> None:
    assert "store" in _mtrains("bench", "--help").stdout


@pytest.mark.parametrize("args", [[], ["no-such-command"], ["bench", "no-such-benchmark"]])
def test_usage_errors_exit_two(args: list[str]) -> None:
    result = _mtrains(*args)
    assert result.returncode == 2
    assert "error:" in result.stderr


def test_bench_without_a_source_checkout_exits_two(tmp_path: Path) -> None:
    # The package as installed: no benchmarks/lib next to it.
    shutil.copytree(Path(torchrec_mtrains.__file__).parent, tmp_path / "site" / "torchrec_mtrains",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = "import sys; from torchrec_mtrains.cli import main; sys.exit(main(['bench', 'store']))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    assert "source checkout" in result.stderr and "python benchmarks/bench_store.py" in result.stderr
