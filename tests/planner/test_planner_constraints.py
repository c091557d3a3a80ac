"""TorchRec's ParameterConstraints in the StorageAwarePlanner: a key_value table stays on
the SSD with its CacheParams (load factor, algorithm, stats curve) and comes out as
TorchRec's KEY_VALUE plan entry; FBGEMM-only kernels keep a table whole; sharding_types
limit the options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.planner import ParameterConstraints
from torchrec.distributed.types import CacheParams, CacheStatistics, KeyValueParams

from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model.placement import PlacementError
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

ROWS = (200_000, 50_000, 500)


class HalfMisses(CacheStatistics):
    """A table whose cache misses half its lookups at any size below the whole table."""

    @property
    def expected_lookups(self) -> float:
        return 123.0

    def expected_miss_rate(self, clf: float) -> float:
        return 0.0 if clf >= 1.0 else 0.5

    @property
    def cacheability(self) -> float:
        return 0.5


def _ebc() -> EmbeddingBagCollection:
    configs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=8, feature_names=[f"f{i}"])
               for i, n in enumerate(ROWS)]
    return EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))


def _kv(tmp_path: Path, cache: CacheParams, **kwargs) -> ParameterConstraints:
    return ParameterConstraints(compute_kernels=["key_value"], cache_params=cache,
                                key_value_params=KeyValueParams(ssd_storage_directory=str(tmp_path / "e@local_rank")),
                                **kwargs)


def test_key_value_constraints_pin_the_table_to_ssd_with_its_cache(tmp_path: Path) -> None:
    cache = CacheParams(load_factor=0.03, algorithm=CacheAlgorithm.LFU, stats=HalfMisses())
    constraints = {"t0": _kv(tmp_path, cache, sharding_types=["row_wise"]),
                   "t1": ParameterConstraints(compute_kernels=["fused"])}
    # DRAM holds everything: unconstrained, t0 would stay whole in DRAM.
    planner = StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=2, constraints=constraints)
    plan = planner.plan(_ebc(), [TieredEmbeddingBagCollectionSharder()]).plan[""]
    where = planner.last_placement.tables
    assert where["t0"].tier is Tier.SSD and where["t0"].cache_rows == pytest.approx(0.03 * ROWS[0])
    assert where["t1"].tier is Tier.DRAM and where["t1"].cache_rows == 0
    t0 = plan["t0"]
    assert (t0.compute_kernel, t0.sharding_type) == ("key_value", "row_wise")
    assert t0.key_value_params == constraints["t0"].key_value_params  # '@local_rank' left for each rank
    assert t0.cache_params.load_factor == pytest.approx(0.03) and t0.cache_params.algorithm == CacheAlgorithm.LFU
    assert plan["t1"].compute_kernel == "fused"
    # The stats' curve predicted t0's hits: half of the lookups at this cache size.
    t0_model = next(t for t in planner.last_model.tables if t.name == "t0")
    assert t0_model.locality.unique_rows_per_step == 123.0
    assert t0_model.locality.hit_rate(0.03 * ROWS[0]) == pytest.approx(0.5)


def test_key_value_without_load_factor_gets_a_placed_cache_and_the_planners_policy(tmp_path: Path) -> None:
    planner = StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=1, cache_algorithm="lfu",
                                  constraints={"t0": _kv(tmp_path, None)})
    plan = planner.plan(_ebc(), [TieredEmbeddingBagCollectionSharder()]).plan[""]
    where = planner.last_placement.tables["t0"]
    assert where.tier is Tier.SSD and where.cache_rows > 0
    assert plan["t0"].cache_params.load_factor == pytest.approx(where.cache_rows / ROWS[0])
    assert plan["t0"].cache_params.algorithm == CacheAlgorithm.LFU


def test_a_key_value_table_needs_an_ssd_tier(tmp_path: Path) -> None:
    planner = StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=1, tiers=[Tier.DRAM, Tier.SCM],
                                  constraints={"t0": _kv(tmp_path, CacheParams(load_factor=0.1))})
    with pytest.raises(PlacementError, match="table t0 is constrained to tier SSD"):
        planner.plan(_ebc(), [TieredEmbeddingBagCollectionSharder()])
