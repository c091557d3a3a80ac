"""The StorageAwarePlanner plans TorchRec's EmbeddingCollections (a row per id: sequences)
with EmbeddingBagCollections, together: a sequence table is marked as one, its lookups are
its sequence lengths and its output (a row per id) costs its bytes; the plan trains under
DMP with the tiered sharders."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner import StorageAwarePlanner
from torchrec_mtrains.planner.model.estimator import table_cost

DIM = 16


class Mixed(nn.Module):
    def __init__(self, device: str = "cpu") -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig

        super().__init__()
        torch.manual_seed(0)
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="bag", num_embeddings=20_000, embedding_dim=DIM, feature_names=["f_bag"])],
            device=torch.device(device))
        self.ec = EmbeddingCollection(tables=[
            EmbeddingConfig(name="item_ids", num_embeddings=50_000, embedding_dim=DIM, feature_names=["f_item_ids"])],
            device=torch.device(device))

    def forward(self, bags, seqs):
        pooled = self.ebc(bags)["f_bag"].sum()
        return pooled + self.ec(seqs)["f_item_ids"].values().sum()


def _planner(**kw) -> StorageAwarePlanner:
    return StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=1,
                               locality={"item_ids": {"pooling_factor": 30.0, "zipf_alpha": 1.05}}, **kw)


def test_model_spec_marks_sequence_tables() -> None:
    spec = _planner().model_spec(Mixed(device="meta"))
    by_name = {t.name: t for t in spec.tables}
    assert by_name["item_ids"].sequence and not by_name["bag"].sequence
    assert by_name["item_ids"].pooling_factor == 30.0  # its lookups: the sequence length


def test_a_sequence_costs_its_output() -> None:
    spec = _planner().model_spec(Mixed(device="meta"))
    items = {t.name: t for t in spec.tables}["item_ids"]
    node = CPU_NODE
    pooled = table_cost(dataclasses.replace(items, sequence=False), Tier.DRAM, 0.0, node, 64)
    seq = table_cost(items, Tier.DRAM, 0.0, node, 64)
    extra = 2 * 64 * 30.0 * DIM * 4 / node.compute.tbe_bytes_per_s
    assert seq.compute_s == pytest.approx(pooled.compute_s + extra, rel=1e-12)


def test_a_mixed_model_plans_and_trains(process_group, tmp_path) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec.distributed.planner import ParameterConstraints

    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredEmbeddingCollectionSharder

    from torchrec.distributed.types import KeyValueParams

    kv = KeyValueParams(ssd_storage_directory=str(tmp_path / "kv"))
    planner = _planner(storage_dir=str(tmp_path),
                       constraints={"item_ids": ParameterConstraints(compute_kernels=["key_value"], key_value_params=kv)})
    model = Mixed()
    sharders = [TieredEmbeddingBagCollectionSharder(), TieredEmbeddingCollectionSharder()]
    plan = planner.collective_plan(model, sharders, torch.distributed.GroupMember.WORLD)
    assert set(plan.plan) == {"ebc", "ec"}
    assert plan.plan["ec"]["item_ids"].compute_kernel == "key_value"  # on the SSD tier, as constrained
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(torch.distributed.GroupMember.WORLD),
                                   plan=plan, sharders=sharders, device=torch.device("cpu"))
    bags = KeyedJaggedTensor.from_lengths_sync(keys=["f_bag"], values=torch.arange(8), lengths=torch.full((4,), 2))
    seqs = KeyedJaggedTensor.from_lengths_sync(keys=["f_item_ids"], values=torch.arange(10) * 7,
                                               lengths=torch.tensor([3, 0, 5, 2]))
    loss = dmp(bags, seqs)
    loss.backward()
    assert torch.isfinite(loss)
    assert list(tmp_path.rglob("*.blk")), "the constrained sequence table keeps its rows in a block store"


def test_model_yaml_takes_sequence_tables() -> None:
    from torchrec_mtrains.planner.model.model_spec import parse_model_spec

    doc = {"batch_size": 64, "target_qps": 1000, "tables": [
        {"name": "hist", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 50, "zipf_alpha": 1.1,
         "sequence": True},
        {"name": "bag", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 5, "zipf_alpha": 1.1}]}
    tables = {t.name: t for t in parse_model_spec(doc).tables}
    assert tables["hist"].sequence and not tables["bag"].sequence
    doc["tables"][0]["sequence"] = "yes"
    with pytest.raises(ValueError, match="sequence='yes' must be true or false"):
        parse_model_spec(doc)
