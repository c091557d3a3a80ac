"""KEY_VALUE tables on the CPU, fast: how TorchRec's KeyValueParams and CacheParams map to
the tiered kernel's settings, the warnings for fields ignored and the errors for fields
refused, what the sharder offers, TorchRec's planner on a CPU topology with ssd_cap, and a
KEY_VALUE plan sharded in this process (world size 1)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import CacheParams, KeyValueParams, ParameterSharding, ShardingPlan
from torchrec.modules.embedding_configs import DataType

from torchrec_mtrains import Tier
from torchrec_mtrains.sharding import (
    ShardedTieredEmbeddingBagCollection,
    TieredEmbeddingBagCollectionSharder,
    TieredParameterSharding,
    TieredParams,
)
from torchrec_mtrains.sharding import key_value
from torchrec_mtrains.sharding.key_value import as_tiered_plan, tiered_params_of


def _entry(kv=None, cache=None, kernel="key_value") -> ParameterSharding:
    return ParameterSharding(sharding_type="table_wise", compute_kernel=kernel, ranks=[0],
                             key_value_params=kv, cache_params=cache)


def _ebc(rows=(100, 200, 300), dim=8, device="cpu") -> EmbeddingBagCollection:
    configs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=r, embedding_dim=dim, feature_names=[f"f{i}"])
               for i, r in enumerate(rows)]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


# -------------------------------------------------------------- field mapping ----
def test_key_value_and_cache_params_map_to_tier_settings() -> None:
    kv = KeyValueParams(ssd_storage_directory="/nvme/emb@local_rank", l2_cache_size=2, bulk_init_chunk_size=1024,
                        lazy_bulk_init_enabled=True)
    cache = CacheParams(load_factor=0.3, algorithm=CacheAlgorithm.LFU, precision=DataType.FP32,
                        prefetch_pipeline=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every field here is honoured: no warning
        p = tiered_params_of("t", _entry(kv, cache), DataType.FP32, rank=3)
    assert p == TieredParams(Tier.SSD, cache_load_factor=0.3, cache_algorithm="lfu", storage_dir="/nvme/emb3",
                             ssd_dram_cache_mb=2048.0)
    # Unset: FBGEMM's defaults (LRU; the load factor falls to the kernel's default).
    p = tiered_params_of("t", _entry(KeyValueParams(ssd_storage_directory="/d")), DataType.FP32, rank=0)
    assert (p.cache_algorithm, p.cache_load_factor, p.ssd_dram_cache_mb) == ("lru", None, 0.0)
    assert TieredParams.from_fused_params(p.to_fused_params()) == p


def test_as_tiered_plan_replaces_key_value_entries_only() -> None:
    fused = _entry(kernel="fused")
    plan = {"kv": _entry(KeyValueParams(ssd_storage_directory="/d@local_rank"), CacheParams(load_factor=0.1)),
            "plain": fused}
    out = as_tiered_plan(plan, {"kv": DataType.FP32, "plain": DataType.FP32}, rank=1)
    assert out["plain"] is fused
    kv = out["kv"]
    assert isinstance(kv, TieredParameterSharding) and kv.compute_kernel == "customized_kernel"
    assert kv.tiered.tier is Tier.SSD and kv.tiered.storage_dir == "/d1"
    assert (kv.sharding_type, kv.ranks, kv.cache_params, kv.key_value_params) == ("table_wise", [0], None, None)
    assert plan["kv"].compute_kernel == "key_value"  # the given plan is left as it is


def test_every_field_of_torchrecs_params_has_a_decision() -> None:
    kv_fields = {f.name for f in dataclasses.fields(KeyValueParams)}
    decided = key_value._KV_HONOURED | set(key_value._KV_IGNORED) | set(key_value._KV_REFUSED)
    assert kv_fields <= decided, kv_fields - decided
    cache_fields = {f.name for f in dataclasses.fields(CacheParams)}
    assert cache_fields <= key_value._CACHE_HONOURED | set(key_value._CACHE_IGNORED)


@pytest.mark.parametrize(
    "kv,cache,field",
    [
        (dict(ssd_rocksdb_shards=4), {}, "KeyValueParams.ssd_rocksdb_shards"),
        (dict(max_l1_cache_size=100), {}, "KeyValueParams.max_l1_cache_size"),
        (dict(use_passed_in_path=False), {}, "KeyValueParams.use_passed_in_path"),
        (dict(lazy_bulk_init_enabled=False), {}, "KeyValueParams.lazy_bulk_init_enabled"),
        ({}, dict(reserved_memory=1.0), "CacheParams.reserved_memory"),
    ],
)
def test_ignored_fields_warn_once_naming_the_field(kv, cache, field) -> None:
    entry = _entry(KeyValueParams(ssd_storage_directory="/d", **kv), CacheParams(**cache))
    plan = {"a": entry, "b": entry}  # two tables: still one warning
    with pytest.warns(UserWarning, match=field) as record:
        as_tiered_plan(plan, {"a": DataType.FP32, "b": DataType.FP32}, rank=0)
    ours = [w for w in record if field in str(w.message)]
    assert len(ours) == 1 and "tables a, b" in str(ours[0].message)


@pytest.mark.parametrize(
    "kv,cache,dtype,match",
    [
        (dict(kvzch_tbe_config=object()), {}, DataType.FP32, "KeyValueParams.kvzch_tbe_config"),
        (dict(load_ckpt_without_opt=True), {}, DataType.FP32, "KeyValueParams.load_ckpt_without_opt"),
        (dict(ps_hosts=(("::1", 2000),)), {}, DataType.FP32, "KeyValueParams.ps_hosts"),
        ({}, dict(precision=DataType.FP16), DataType.FP32, "CacheParams.precision"),
        ({}, dict(load_factor=-0.5), DataType.FP32, r"CacheParams.load_factor=-0.5 must be a number > 0"),
        (dict(l2_cache_size=-1), {}, DataType.FP32, "l2_cache_size"),
    ],
)
def test_fields_whose_ignoring_would_change_results_are_refused(kv, cache, dtype, match) -> None:
    entry = _entry(KeyValueParams(ssd_storage_directory="/d", **kv), CacheParams(**cache))
    with pytest.raises(ValueError, match=match):
        as_tiered_plan({"t": entry}, {"t": dtype}, rank=0)


@pytest.mark.parametrize("kv", [None, KeyValueParams(l2_cache_size=1)])
def test_a_key_value_table_needs_a_storage_directory(kv) -> None:
    with pytest.raises(ValueError, match="table t: .*ssd_storage_directory"):
        as_tiered_plan({"t": _entry(kv)}, {"t": DataType.FP32}, rank=0)


# --------------------------------------------------- sharder and TorchRec's planner ----
def test_sharder_offers_key_value_on_cpu_only_for_tiered_shardings() -> None:
    sharder = TieredEmbeddingBagCollectionSharder()
    for sharding_type in ("table_wise", "row_wise", "column_wise"):
        kernels = sharder.compute_kernels(sharding_type, "cpu")
        assert "key_value" in kernels and "customized_kernel" in kernels and "fused" in kernels
    assert "key_value" not in sharder.compute_kernels("data_parallel", "cpu")


def _constraints(tmp_path: Path, cache=None):
    return {"t0": ParameterConstraints(
        compute_kernels=["key_value"],
        key_value_params=KeyValueParams(ssd_storage_directory=str(tmp_path / "emb@local_rank")),
        cache_params=cache or CacheParams(load_factor=0.1, algorithm=CacheAlgorithm.LFU),
    )}


def test_torchrecs_planner_plans_key_value_on_a_cpu_topology(tmp_path: Path) -> None:
    ebc = _ebc(rows=(10_000, 200, 300), dim=16, device="meta")
    topology = Topology(world_size=2, compute_device="cpu", ssd_cap=1 << 30)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=_constraints(tmp_path))
    plan = planner.plan(ebc, [TieredEmbeddingBagCollectionSharder()]).plan[""]
    assert plan["t0"].compute_kernel == "key_value"
    assert plan["t0"].key_value_params.ssd_storage_directory == str(tmp_path / "emb@local_rank")
    assert plan["t0"].cache_params.algorithm == CacheAlgorithm.LFU
    # Tables without constraints stay on FBGEMM's kernel: CUSTOMIZED_KERNEL needs tier
    # settings only our plans write.
    assert plan["t1"].compute_kernel == plan["t2"].compute_kernel == "fused"


def test_torchrecs_planner_puts_key_value_tables_on_ssd_cap(tmp_path: Path) -> None:
    # 10,000 rows x 16 fp32 = 640 KB of weights: they go to the SSD, not to DDR.
    ebc = _ebc(rows=(10_000, 200, 300), dim=16, device="meta")
    sharders = [TieredEmbeddingBagCollectionSharder()]
    enough = Topology(world_size=1, compute_device="cpu", ssd_cap=1 << 20)
    plan = EmbeddingShardingPlanner(topology=enough, constraints=_constraints(tmp_path)).plan(ebc, sharders)
    assert plan.plan[""]["t0"].compute_kernel == "key_value"
    small = Topology(world_size=1, compute_device="cpu", ssd_cap=100 << 10)
    with pytest.raises(PlannerError):
        EmbeddingShardingPlanner(topology=small, constraints=_constraints(tmp_path)).plan(ebc, sharders)


# ------------------------------------------------------------ sharded in-process ----
def test_a_key_value_plan_shards_onto_the_ssd_tier(process_group, tmp_path: Path) -> None:
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise

    ebc = _ebc()
    kv = KeyValueParams(ssd_storage_directory=str(tmp_path / "emb@local_rank"), l2_cache_size=1)
    cache = CacheParams(load_factor=0.5, algorithm=CacheAlgorithm.LFU)
    module_plan = construct_module_sharding_plan(
        ebc, {"t0": table_wise(rank=0, compute_kernel="key_value"), "t1": table_wise(rank=0, compute_kernel="key_value"),
              "t2": table_wise(rank=0)},
        sharder=TieredEmbeddingBagCollectionSharder(), local_size=1, world_size=1, device_type="cpu")
    for name in ("t0", "t1"):
        module_plan[name].key_value_params, module_plan[name].cache_params = kv, cache
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": module_plan}),
                                   sharders=[TieredEmbeddingBagCollectionSharder()], device=torch.device("cpu"))
    sharded = next(m for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection))
    assert sorted(sharded.tiered_table_names()) == ["t0", "t1"]
    (kernel,) = sharded.tiered_kernels()
    config = kernel.emb_module.config
    assert kernel.emb_module.tiers == [Tier.SSD, Tier.SSD]
    assert config.cache_algorithm == "lfu" and config.cache_rows == (50, 100)
    assert config.ssd_dram_cache_mb == 512.0  # l2_cache_size=1 GB, per kernel: split between its 2 stores
    assert kernel.storage_dir == str(tmp_path / "emb0" / "rank_0")
