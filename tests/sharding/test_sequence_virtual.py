"""A virtual table in an EmbeddingCollection (a row per id) in TorchRec's words --
use_virtual_table, total_num_buckets, an eviction policy, the dram_virtual_table kernel on
TorchRec's own planner -- trains on the CPU with the TieredEmbeddingCollectionSharder: each
distinct id its own row, rows looked up unpooled."""

from __future__ import annotations

import torch
from torch import nn

from tests.support.virtual_dmp import tiered_kernels

IDS = 2**40


class SequenceModel(nn.Module):
    def __init__(self) -> None:
        from torchrec import EmbeddingCollection, EmbeddingConfig
        from torchrec.modules.embedding_configs import CountBasedEvictionPolicy

        super().__init__()
        policy = CountBasedEvictionPolicy(training_id_eviction_trigger_count=100_000, eviction_threshold=2,
                                          decay_rate=0.8)
        self.ec = EmbeddingCollection(tables=[EmbeddingConfig(
            name="history", num_embeddings=IDS, embedding_dim=8, feature_names=["f_history"], use_virtual_table=True,
            total_num_buckets=8, virtual_table_eviction_policy=policy, weight_init_min=-0.1, weight_init_max=0.1)],
            device=torch.device("meta"))

    def forward(self, kjt):
        return self.ec(kjt)["f_history"].values().pow(2).sum()


def test_virtual_sequence_table_trains_each_id_its_own_row(process_group) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_mtrains.sharding import TieredEmbeddingCollectionSharder

    pg = torch.distributed.GroupMember.WORLD
    model = SequenceModel()
    constraints = {"history": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["dram_virtual_table"],
                                                   use_virtual_table=True)}
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    sharder = TieredEmbeddingCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                             "learning_rate": 0.05})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).collective_plan(model, [sharder], pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=[sharder],
                                   device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    hot = torch.randint(0, IDS, (40,), generator=g)
    seen, losses = set(), []
    for _ in range(12):
        lengths = torch.randint(0, 12, (16,), generator=g)
        n = int(lengths.sum())
        ids = torch.where(torch.rand(n, generator=g) < 0.7, hot[torch.randint(0, 40, (n,), generator=g)],
                          torch.randint(0, IDS, (n,), generator=g))
        seen |= set(ids.tolist())
        loss = dmp(KeyedJaggedTensor.from_lengths_sync(keys=["f_history"], values=ids, lengths=lengths))
        loss.backward()
        losses.append(float(loss) / n)
    (emb,) = tiered_kernels(dmp)
    (stats,) = emb.cache_stats().values()
    assert stats["live_ids"] == len(seen)  # no two ids share a row
    assert losses[-1] < losses[0]  # the hot ids' rows shrink under the squared loss
