"""In-place writes into a sharded model's ``state_dict()`` tensors reach its tiered tables, as
they reach FUSED tables (whose state_dict tensors alias the weights): ``copy_``, ``fill_``, a
slice's ``copy_``, torch.distributed.checkpoint's in-place ``load`` with no
``load_state_dict`` call, and the fused optimizer's state tensors; a write that can no longer
be honoured raises naming the table (world size 1, in this process)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from torchrec_mtrains import Tier
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan

ROWS, DIM = 300, 8
KEY = "embedding_bags.t.weight"
TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]


def _model(tmp_path: Path, tier: Tier, state_dict_ram_mb: float = 1024.0) -> DistributedModelParallel:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["f"])],
        device=torch.device("cpu"),
    )
    params = TieredParams(tier, cache_load_factor=0.1, storage_dir=str(tmp_path), state_dict_ram_mb=state_dict_ram_mb)
    plan = tiered_sharding_plan(ebc, {"t": params}, 1)
    sharder = TieredEmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1})
    return DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), sharders=[sharder],
                                    device=torch.device("cpu"))


def _shard(sd, key: str = KEY) -> torch.Tensor:
    return sd[key].local_shards()[0].tensor


def _weights(model) -> torch.Tensor:
    """The table's weights as the tiers hold them (a fresh state_dict)."""
    return _shard(model.state_dict()).clone()


def _batch(ids) -> KeyedJaggedTensor:
    ids = torch.tensor(ids)
    return KeyedJaggedTensor.from_lengths_sync(["f"], ids, torch.ones_like(ids))


def _lookup(model, ids) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(_batch(ids)).to_dict()["f"]


@pytest.mark.parametrize("tier", TIERS)
def test_copy_fill_and_slice_writes_reach_the_table(process_group, tmp_path: Path, tier: Tier) -> None:
    model = _model(tmp_path, tier)
    _lookup(model, [0, 1, 2])  # rows 0..2 in the cache: the writes must reach it too
    new = torch.randn(ROWS, DIM)
    _shard(model.state_dict()).copy_(new)
    assert torch.equal(_lookup(model, [0, 1, 2, 250]), new[[0, 1, 2, 250]])
    _shard(model.state_dict()).fill_(0.5)
    assert torch.equal(_weights(model), torch.full((ROWS, DIM), 0.5))
    sd = model.state_dict()
    _shard(sd)[10:20, 2:6].copy_(torch.ones(10, 4))
    _shard(sd)[7].fill_(-1.0)
    del sd
    gc.collect()  # dropped before the table was read: the writes still count
    want = torch.full((ROWS, DIM), 0.5)
    want[10:20, 2:6] = 1.0
    want[7] = -1.0
    assert torch.equal(_lookup(model, [10, 7]), want[[10, 7]])
    assert torch.equal(_weights(model), want)


@pytest.mark.parametrize("tier", TIERS)
def test_dcp_load_in_place_restores_tiered_tables_without_load_state_dict(process_group, tmp_path: Path,
                                                                          tier: Tier) -> None:
    model = _model(tmp_path / "a", tier)
    saved = _weights(model)
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "ckpt"))
    model.train()
    for _ in range(3):
        model(_batch(list(range(0, ROWS, 7)))).values().sum().backward()
    assert not torch.equal(_weights(model), saved)
    dcp.load(model.state_dict(), checkpoint_id=str(tmp_path / "ckpt"))  # in place, as for FUSED tables
    assert torch.equal(_weights(model), saved)


def test_writes_reach_a_table_staged_in_a_file(process_group, tmp_path: Path) -> None:
    # A shard over state_dict_ram_mb is staged in a memory-mapped file, not RAM.
    model = _model(tmp_path, Tier.SSD, state_dict_ram_mb=0.001)
    sd = model.state_dict()
    staged = _shard(sd)
    assert staged.untyped_storage().filename is not None
    new = torch.randn(ROWS, DIM)
    staged.copy_(new)
    assert torch.equal(_lookup(model, [3, 299]), new[[3, 299]])


def _kernel(model):
    return model._dmp_wrapped_module.tiered_kernels()[0]


def test_fused_optimizer_state_writes_reach_the_table(process_group, tmp_path: Path) -> None:
    model = _model(tmp_path, Tier.SSD)
    state = model.fused_optimizer.state_dict()["state"][KEY]["t.momentum1"].local_shards()[0].tensor
    state.fill_(2.0)
    state[:5].copy_(torch.arange(5.0))
    want = torch.full((ROWS,), 2.0)
    want[:5] = torch.arange(5.0)
    assert torch.equal(_kernel(model).emb_module.split_optimizer_states()[0][0], want)


def test_a_write_after_the_table_trained_is_refused_naming_it(process_group, tmp_path: Path) -> None:
    model = _model(tmp_path, Tier.SCM)
    sd = model.state_dict()
    model.train()
    model(_batch([1, 2])).values().sum().backward()
    trained = _weights(model)
    _shard(sd)[5].fill_(3.0)  # written back whole, it would undo the step
    with pytest.raises(ValueError, match="table t: its weights were written in place .* before the table last changed"):
        model(_batch([1]))
    assert torch.equal(_weights(model), trained)  # nothing half-applied; raised once
    model(_batch([1]))


def test_a_write_then_load_state_dict_of_the_same_tensors(process_group, tmp_path: Path) -> None:
    # TorchRec's restore recipe: load into state_dict() in place, then load_state_dict it.
    model = _model(tmp_path, Tier.DRAM)
    sd = model.state_dict()
    _shard(sd).fill_(0.25)
    model.load_state_dict(sd)
    _shard(sd)[0].fill_(1.0)  # still the table's own values: the write is honoured
    want = torch.full((ROWS, DIM), 0.25)
    want[0] = 1.0
    assert torch.equal(_weights(model), want)


def test_unwritten_copies_are_forgotten_once_dropped(process_group, tmp_path: Path) -> None:
    model = _model(tmp_path, Tier.DRAM)
    kernel = _kernel(model)
    sd = model.state_dict()
    assert len(kernel._live) >= 1
    del sd
    gc.collect()
    assert len(kernel._live) == 0


def test_sequence_collection_writes_reach_the_table(process_group, tmp_path: Path) -> None:
    from torchrec import EmbeddingCollection, EmbeddingConfig

    from torchrec_mtrains.sharding import TieredEmbeddingCollectionSharder

    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["f"])],
        device=torch.device("cpu"))
    plan = tiered_sharding_plan(ec, {"t": TieredParams(Tier.SSD, cache_load_factor=0.1, storage_dir=str(tmp_path))}, 1)
    model = DistributedModelParallel(ec, plan=ShardingPlan({"": plan}), device=torch.device("cpu"),
                                     sharders=[TieredEmbeddingCollectionSharder()])
    new = torch.randn(ROWS, DIM)
    _shard(model.state_dict(), "embeddings.t.weight").copy_(new)
    model.eval()
    with torch.no_grad():
        got = model(_batch([4, 250]))["f"].values()
    assert torch.equal(got, new[[4, 250]])


def test_key_value_table_on_torchrecs_planner_takes_writes(process_group, tmp_path: Path) -> None:
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import KeyValueParams

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["f"])],
        device=torch.device("cpu"))
    sharder = TieredEmbeddingBagCollectionSharder()
    constraints = {"t": ParameterConstraints(compute_kernels=["key_value"], key_value_params=KeyValueParams(
        ssd_storage_directory=str(tmp_path)))}
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, [sharder])
    model = DistributedModelParallel(ebc, plan=plan, sharders=[sharder], device=torch.device("cpu"))
    assert _kernel(model).params.tier is Tier.SSD
    new = torch.randn(ROWS, DIM)
    _shard(model.state_dict()).copy_(new)
    assert torch.equal(_lookup(model, [0, 299]), new[[0, 299]])
