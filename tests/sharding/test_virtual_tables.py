"""Virtual tables in TorchRec's vocabulary, fast: the eviction policies' fields honoured,
warned about or refused, what the sharder offers, plan entries turned into tiered ones,
TorchRec's planner with virtual-table constraints, a plan sharded in this process, and
TorchRec's own planner unchanged by importing the package."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import KeyValueParams, ParameterSharding
from torchrec.modules.embedding_configs import (
    CountBasedEvictionPolicy,
    CountTimestampMixedEvictionPolicy,
    DataType,
    FeatureScoreBasedEvictionPolicy,
    NoEvictionPolicy,
    TimestampBasedEvictionPolicy,
)

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels.virtual_rows import EvictionSpec
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParameterSharding
from torchrec_mtrains.sharding.key_value import as_tiered_plan
from torchrec_mtrains.sharding.virtual_tables import (
    DEFAULT_VIRTUAL_ROWS,
    VIRTUAL_KERNELS,
    eviction_spec_of,
    virtual_shard_rows,
    warn_ignored,
)


def test_policies_map_to_eviction_rules() -> None:
    assert eviction_spec_of("t", None) == EvictionSpec()
    assert eviction_spec_of("t", NoEvictionPolicy()) == EvictionSpec()
    count = CountBasedEvictionPolicy(training_id_eviction_trigger_count=1000, eviction_threshold=5, decay_rate=0.9)
    assert eviction_spec_of("t", count) == EvictionSpec(trigger_ids=1000, count_threshold=5, decay_rate=0.9)
    ttl = TimestampBasedEvictionPolicy(training_id_eviction_trigger_count=10, eviction_ttl_mins=3)
    assert eviction_spec_of("t", ttl) == EvictionSpec(trigger_ids=10, ttl_seconds=180)
    mixed = CountTimestampMixedEvictionPolicy(eviction_threshold=2, decay_rate=0.5, eviction_ttl_mins=1)
    assert eviction_spec_of("t", mixed) == EvictionSpec(count_threshold=2, decay_rate=0.5, ttl_seconds=60)
    # TorchRec fills the metadata-header fields itself: nothing to warn about.
    count.init_metaheader_config(DataType.FP32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notes: dict = {}
        eviction_spec_of("t", count, notes)
        warn_ignored(notes)


def test_inference_fields_are_warned_once_by_name() -> None:
    notes: dict = {}
    eviction_spec_of("a", CountBasedEvictionPolicy(eviction_threshold=3, inference_eviction_threshold=7), notes)
    eviction_spec_of("b", TimestampBasedEvictionPolicy(max_inference_id_num_per_rank=5), notes)
    eviction_spec_of("c", CountBasedEvictionPolicy(eviction_threshold=3, inference_eviction_threshold=9), notes)
    with pytest.warns(UserWarning) as record:
        warn_ignored(notes)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert any("CountBasedEvictionPolicy.inference_eviction_threshold" in m and "a, c" in m for m in messages)
    assert any("max_inference_id_num_per_rank" in m and "tables b" in m for m in messages)


@pytest.mark.parametrize("policy, why", [
    (FeatureScoreBasedEvictionPolicy(), "feature-score"),
])
def test_policies_not_built_on_the_cpu_are_refused(policy, why) -> None:
    with pytest.raises(ValueError, match=f"table t: {type(policy).__name__}.*{why}"):
        eviction_spec_of("t", policy)


def test_bad_policy_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="CountBasedEvictionPolicy.*decay_rate"):
        eviction_spec_of("t", CountBasedEvictionPolicy(decay_rate=2.0))


def test_shard_rows() -> None:
    spec = EvictionSpec(trigger_ids=10_000)
    assert virtual_shard_rows("t", 1000, spec, 2**39, 2**40) == 500
    assert virtual_shard_rows("t", None, spec, 2**39, 2**40) == 10_000 + 4096
    with pytest.warns(UserWarning, match="each shard holds up to"):
        assert virtual_shard_rows("t", None, EvictionSpec(), 2**39, 2**40) == DEFAULT_VIRTUAL_ROWS
    assert virtual_shard_rows("t", None, EvictionSpec(), 100, 100) == 100  # never more than its ids


def test_sharder_offers_virtual_kernels_for_row_wise_on_the_cpu() -> None:
    sharder = TieredEmbeddingBagCollectionSharder()
    assert set(VIRTUAL_KERNELS) <= set(sharder.compute_kernels("row_wise", "cpu"))
    assert not set(VIRTUAL_KERNELS) & set(sharder.compute_kernels("table_wise", "cpu"))


def _entry(kernel: str, kv=None) -> ParameterSharding:
    return ParameterSharding(sharding_type="row_wise", compute_kernel=kernel, ranks=[0], key_value_params=kv)


def test_plan_entries_become_tiered() -> None:
    kv = KeyValueParams(ssd_storage_directory="/d/@local_rank")
    plan = {"a": _entry("dram_virtual_table"), "b": _entry("ssd_virtual_table", kv),
            "c": _entry("dram_ssd_virtual_table", kv), "d": _entry("fused")}
    out = as_tiered_plan(plan, {k: DataType.FP32 for k in plan}, rank=1, virtual={"a": True, "b": True, "c": True})
    assert isinstance(out["a"], TieredParameterSharding) and out["a"].tiered.tier is Tier.DRAM
    assert out["a"].compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    assert (out["b"].tiered.tier, out["b"].tiered.storage_dir, out["b"].tiered.ssd_dram_cache_mb) == (Tier.SSD, "/d/1", 0)
    assert out["c"].tiered.ssd_dram_cache_mb == 1024.0  # dram_ssd: the block store's DRAM cache
    assert out["d"] is plan["d"]
    with pytest.raises(ValueError, match="table a: compute kernel dram_virtual_table needs a virtual table"):
        as_tiered_plan({"a": plan["a"]}, {"a": DataType.FP32}, rank=0, virtual={"a": False})
    with pytest.raises(ValueError, match="ssd_storage_directory"):
        as_tiered_plan({"b": _entry("ssd_virtual_table")}, {"b": DataType.FP32}, rank=0, virtual={"b": True})


def _virtual_ebc(device: str = "meta") -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="v", num_embeddings=2**40, embedding_dim=8, feature_names=["fv"],
                           use_virtual_table=True, total_num_buckets=4,
                           virtual_table_eviction_policy=CountBasedEvictionPolicy(training_id_eviction_trigger_count=5000)),
        EmbeddingBagConfig(name="p", num_embeddings=100, embedding_dim=8, feature_names=["fp"]),
    ], device=torch.device(device))


def test_torchrec_planner_plans_virtual_kernels_on_the_cpu() -> None:
    constraints = {"v": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["dram_virtual_table"],
                                             use_virtual_table=True)}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints)
    plan = planner.plan(_virtual_ebc(), [TieredEmbeddingBagCollectionSharder()])
    entry = plan.plan[""]["v"]
    assert (entry.sharding_type, entry.compute_kernel) == ("row_wise", "dram_virtual_table")
    # Buckets, as TorchRec splits them: 2 of 4 per rank, each 2^38 ids.
    sizes = [s.shard_sizes[0] for s in entry.sharding_spec.shards]
    assert sizes == [2**39, 2**39]
    # The plain table gets none of these kernels: they are for tables that ask.
    assert plan.plan[""]["p"].compute_kernel not in VIRTUAL_KERNELS


_PLAN_SCRIPT = r"""
import json, sys, torch
if sys.argv[1] == "import":
    import torchrec_mtrains.sharding  # noqa: F401
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=d, feature_names=[f"f{i}"])
          for i, (n, d) in enumerate([(1000, 16), (200000, 32), (50, 8), (3000000, 64)])]
ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
    ebc, [EmbeddingBagCollectionSharder()])
print(json.dumps({t: [p.sharding_type, p.compute_kernel, p.ranks] for t, p in sorted(plan.plan[""].items())}))
"""


def test_importing_the_package_leaves_torchrecs_planner_unchanged() -> None:
    plans = []
    for mode in ("plain", "import"):
        out = subprocess.run([sys.executable, "-c", _PLAN_SCRIPT, mode], capture_output=True, text=True, check=True,
                             timeout=300)
        plans.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert plans[0] == plans[1]


def test_a_virtual_table_trains_in_process_and_refuses_dense_state(process_group) -> None:
    """World size 1: TorchRec's planner and DMP; the table trains, and what would read its
    rows as a dense tensor (state_dict, the fused optimizer's state) says why it cannot."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    constraints = {"v": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["dram_virtual_table"],
                                             use_virtual_table=True)}
    sharder = TieredEmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.1})
    ebc = _virtual_ebc()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, [sharder])
    dmp = DistributedModelParallel(ebc, plan=plan, sharders=[sharder], device=torch.device("cpu"))
    ids = torch.tensor([2**39 + 5, 7, 2**40 - 1, 7, 123], dtype=torch.int64)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["fv", "fp"], values=torch.cat([ids, torch.tensor([1, 2])]),
                                              lengths=torch.tensor([3, 2, 1, 1]))
    first = dmp(kjt).to_dict()["fv"].detach().clone()
    dmp(kjt).to_dict()["fv"].sum().backward()
    assert not torch.equal(dmp(kjt).to_dict()["fv"], first), "the virtual table trained"
    (collection,) = [m for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection)]
    (kernel,) = collection.tiered_kernels()
    live, _ = kernel.emb_module.virtual_ids(0)
    assert sorted(live.tolist()) == sorted({int(i) for i in ids})
    with pytest.raises(ValueError, match="table v is a virtual table"):
        dmp.state_dict()
    kernel.emb_module.close()
